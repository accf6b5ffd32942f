"""``/metrics`` on the HTTP port: scraped over HTTP and parsed with prometheus_client's
own parser, after real traffic over gRPC."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import _histogram

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
        assert m["pynsq_channel_e2e_processing_latency_seconds_count"][spark] == 2
        assert m["pynsq_channel_e2e_processing_latency_seconds_bucket"][
            _ch("events", "spark", le="+Inf")] == 2
    idle = _ch("events", "idle")
    assert m["pynsq_channel_depth"][idle] == 10
    assert m["pynsq_channel_clients"][idle] == 0
    assert m["pynsq_topic_messages_total"][(("topic", "events"),)] == 10
    assert m["pynsq_topic_message_bytes_total"][(("topic", "events"),)] == 20
    assert m["pynsq_topics"][()] == 1


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
