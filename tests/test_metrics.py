"""``/metrics`` on the HTTP port: scraped over HTTP and parsed with prometheus_client's
own parser, after real traffic over gRPC."""

from __future__ import annotations

import time
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import _histogram
from broker.stats import HISTOGRAM_BOUNDS_MS, LatencySample

from .helpers import wait_for


def scrape(broker) -> dict[str, dict[tuple, float]]:
    """sample name -> {sorted label items: value}."""
    with urllib.request.urlopen(f"http://{broker.http_address}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        text = r.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def _ch(topic: str, channel: str, **more: str) -> tuple:
    return tuple(sorted({"topic": topic, "channel": channel, **more}.items()))


def test_metrics_count_what_happened_per_topic_and_channel(broker, client):
    client.admin("channel", "create", "events", "spark")
    client.admin("channel", "create", "events", "idle")
    client.multi_publish("events", [f"m{i}" for i in range(10)])
    with client.subscribe("events", "spark", rdy=4, msg_timeout_ms=200) as sub:
        got = [sub.get(timeout=10) for _ in range(4)]
        sub.fin(got[0].id, got[1].id)
        sub.req(got[2].id)
        # got[3] is left to time out
        wait_for(lambda: scrape(broker)["pynsq_channel_timed_out_total"]
                 .get(_ch("events", "spark"), 0) >= 1, 30, message="a timeout counted")
        m = scrape(broker)
        spark = _ch("events", "spark")
        assert m["pynsq_channel_clients"][spark] == 1
        assert m["pynsq_channel_finished_total"][spark] == 2
        assert m["pynsq_channel_requeued_total"][spark] >= 1
        assert m["pynsq_channel_messages_total"][spark] == 10
        in_flight = m["pynsq_channel_in_flight"][spark]
        assert m["pynsq_channel_depth"][spark] + in_flight == 8  # 10 - 2 FINed
        assert m["pynsq_channel_lag"][spark] == 8  # what a consumer has left, as Kafka's lag
        assert m["pynsq_channel_e2e_processing_latency_seconds_count"][spark] == 2
        assert m["pynsq_channel_e2e_processing_latency_seconds_bucket"][
            _ch("events", "spark", le="+Inf")] == 2
    idle = _ch("events", "idle")
    assert m["pynsq_channel_depth"][idle] == 10
    assert m["pynsq_channel_lag"][idle] == 10
    assert m["pynsq_channel_clients"][idle] == 0
    assert m["pynsq_topic_messages_total"][(("topic", "events"),)] == 10
    assert m["pynsq_topic_message_bytes_total"][(("topic", "events"),)] == 20
    assert m["pynsq_topics"][()] == 1


def test_dead_letters_and_expired_messages_are_counted_per_channel(broker, client):
    client.create_channel("jobs", "work", max_attempts=1)
    client.publish("jobs", "stale", ttl_ms=1)
    published_at = time.monotonic()
    wait_for(lambda: time.monotonic() > published_at + 0.05, 5, message="the ttl to pass")
    client.publish("jobs", "poison")
    work = _ch("jobs", "work")
    with client.subscribe("jobs", "work", rdy=1) as sub:
        msg = sub.get(timeout=10)
        assert msg.body == b"poison"   # the expired one was never delivered
        sub.req(msg.id)
        wait_for(lambda: scrape(broker)["pynsq_channel_dead_letters_total"].get(work) == 2,
                 30, message="both messages dead-lettered")
    m = scrape(broker)
    assert m["pynsq_channel_expired_total"][work] == 1
    assert m["pynsq_channel_dead_letters_total"][work] == 2
    assert m["pynsq_topic_messages_total"][(("topic", "jobs.dead"),)] == 2


def test_deferred_and_paused_are_shown(broker, client):
    client.admin("channel", "create", "later", "c")
    client.publish("later", "x", defer_ms=3_600_000)
    client.admin("channel", "pause", "later", "c")
    client.admin("topic", "pause", "later")
    m = scrape(broker)
    assert m["pynsq_channel_deferred"][_ch("later", "c")] == 1
    assert m["pynsq_channel_paused"][_ch("later", "c")] == 1
    assert m["pynsq_topic_paused"][(("topic", "later"),)] == 1


def test_a_deleted_topic_leaves_the_metrics(broker, client):
    client.admin("channel", "create", "gone", "c")
    assert _ch("gone", "c") in scrape(broker)["pynsq_channel_depth"]
    client.admin("topic", "delete", "gone")
    assert _ch("gone", "c") not in scrape(broker).get("pynsq_channel_depth", {})


def test_process_metrics_are_served(broker):
    m = scrape(broker)
    assert m["process_resident_memory_bytes"][()] > 0
    assert m["process_cpu_seconds_total"][()] >= 0
    assert "python_info" in m


def test_latency_buckets_are_cumulative_in_seconds():
    counts = [1, 0, 2] + [0] * 12  # 1 at <=1ms, 2 at <=10ms
    buckets, total_s = _histogram(counts, 25.0)
    assert buckets[0] == ("0.001", 1)
    assert buckets[2] == ("0.01", 3)
    assert buckets[-1] == ("+Inf", 3)
    assert total_s == 0.025


# -- statsd push (nsqd's --statsd-address) ------------------------------------------
def test_statsd_counters_are_the_change_since_the_last_push():
    from broker.stats import ChannelStats, TopicStats
    from broker.statsd import statsd_lines

    def stats(n: int) -> list[TopicStats]:
        channel = ChannelStats("c", depth=n, in_flight_count=0, deferred_count=0,
                               message_count=n, requeue_count=0, timeout_count=0,
                               finish_count=0, paused=False, on_disk_count=n - 1,
                               dead_letter_count=n + 1, expired_count=2 * n)
        return [TopicStats("t", depth=0, message_count=n, message_bytes=2 * n, paused=False,
                           channels=[channel])]

    first, last = statsd_lines("nsq.h_4151.", stats(3), {})
    assert "nsq.h_4151.topic.t.message_count:3|c" in first
    assert "nsq.h_4151.topic.t.channel.c.depth:3|g" in first
    assert "nsq.h_4151.topic.t.channel.c.backend_depth:2|g" in first
    assert "nsq.h_4151.topic.t.channel.c.dead_letter_count:4|c" in first
    second, _ = statsd_lines("nsq.h_4151.", stats(5), last)
    assert "nsq.h_4151.topic.t.message_count:2|c" in second
    assert "nsq.h_4151.topic.t.channel.c.depth:5|g" in second
    assert "nsq.h_4151.topic.t.channel.c.dead_letter_count:2|c" in second
    assert "nsq.h_4151.topic.t.channel.c.expired_count:4|c" in second


def test_statsd_lines_are_packed_into_bounded_datagrams():
    from broker.statsd import packets

    lines = [f"nsq.x.topic.t{i}.depth:{i}|g" for i in range(100)]
    out = packets(lines, 508)
    assert all(len(p) <= 508 for p in out)
    assert b"".join(out).decode().splitlines() == lines


def test_pynsqd_pushes_nsqd_statsd_names_over_udp():
    import socket

    from broker import EmbeddedBroker

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(0.5)
        address = f"127.0.0.1:{udp.getsockname()[1]}"
        with EmbeddedBroker(statsd_address=address, statsd_interval="100ms",
                            broadcast_address="127.0.0.1") as broker:
            broker.call(broker.broker.create_channel, "events", "spark")
            broker.call(broker.broker.multi_publish, "events", [b"a", b"b", b"c"])
            prefix = f"nsq.127_0_0_1_{broker.http_address.rpartition(':')[2]}."
            seen: list[str] = []

            def pushed() -> bool:
                try:
                    seen.extend(udp.recv(65536).decode().splitlines())
                except TimeoutError:
                    pass
                return f"{prefix}topic.events.channel.spark.depth:3|g" in seen

            wait_for(pushed, 30, interval=0, message="a push showing depth 3")
            counted = sum(int(line.split(":")[1].split("|")[0]) for line in seen
                          if line.startswith(f"{prefix}topic.events.message_count:"))
            assert counted == 3  # counters add up to what was published


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(HISTOGRAM_BOUNDS_MS), st.just(0.0),
                          st.floats(0, 100_000, allow_nan=False)), max_size=40))
def test_latencies_of_a_fin_batch_fill_the_histogram_as_fins_one_by_one_do(latencies):
    one_by_one, batch = LatencySample(), LatencySample()
    for latency in latencies:
        one_by_one.add(latency)
    batch.add_many(latencies)
    assert batch.bucket_counts == one_by_one.bucket_counts
    assert batch.sum_ms == one_by_one.sum_ms
    assert batch.percentiles() == one_by_one.percentiles()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 120_000_000_000) | st.sampled_from(
    [b * 1_000_000 for b in HISTOGRAM_BOUNDS_MS]), max_size=6000))
def test_a_leases_fin_timed_by_publish_times_fills_the_histogram_as_fins_one_by_one_do(ages):
    now_ns = 1_800_000_000_000_000_000
    published = [now_ns - age for age in ages]
    one_by_one, lease = LatencySample(), LatencySample()
    for t in published:
        one_by_one.add((now_ns - t) / 1e6)
    lease.add_published(now_ns, published)
    assert lease.bucket_counts == one_by_one.bucket_counts
    assert lease.sum_ms == pytest.approx(one_by_one.sum_ms)
    assert lease.percentiles() == one_by_one.percentiles()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 60_000_000_000), max_size=40),
                          st.booleans()), max_size=30),
       st.sampled_from([1, 7, 50, 4096]))
def test_fins_in_groups_give_the_percentiles_of_the_newest_latencies_as_fins_one_by_one_do(
        fins, size):
    """Groups of FINs of any size (some under the size batched at once), with stats
    read between some of them: always the percentiles of the newest ``size``."""
    one_by_one, grouped = LatencySample(size), LatencySample(size)
    now_ns = 1_800_000_000_000_000_000
    for ages, asked in fins:
        now_ns += 1_000_000
        published = [now_ns - age for age in ages]
        for t in published:
            one_by_one.add((now_ns - t) / 1e6)
        grouped.add_published(now_ns, published)
        if asked:
            assert grouped.percentiles() == one_by_one.percentiles()
    assert grouped.bucket_counts == one_by_one.bucket_counts
    assert grouped.percentiles() == one_by_one.percentiles()
    merged, expected = LatencySample(size), LatencySample(size)
    merged.extend(grouped)
    expected.extend(one_by_one)
    assert merged.percentiles() == expected.percentiles()
