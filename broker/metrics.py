"""Prometheus metrics of a broker, served at ``/metrics`` on the HTTP port.

    curl -s 127.0.0.1:4151/metrics | grep pynsq_channel_depth
    pynsq_channel_depth{channel="spark",topic="events"} 42.0

Everything is read from the core when Prometheus scrapes (a custom collector),
so publishing and delivering pay nothing for it. Per topic (label ``topic``):
depth, paused, messages and message bytes published. Per channel (labels
``topic``, ``channel``): depth, in flight, deferred, lag, clients, paused; messages
delivered, FINished, requeued, timed out, dead-lettered and expired (counters);
and the end-to-end latency, publish to FIN, as a histogram in seconds. The process (CPU, memory,
open files) and the Python runtime (GC) come from prometheus_client's own
collectors.

The collector reads the core directly, so a scrape must run on the core's event
loop, as the HTTP server's handlers do.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from .core import Broker
from .stats import HISTOGRAM_BOUNDS_MS

PREFIX = "pynsq"
CONTENT_TYPE = CONTENT_TYPE_LATEST

_TOPIC = ["topic"]
_CHANNEL = ["topic", "channel"]


class BrokerCollector:
    """A prometheus_client collector reading a ``Broker`` at scrape time."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def describe(self) -> list[Metric]:
        return []  # metric names depend on nothing: no check needed at registration

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        topics = gauge("topics", "Topics the broker has.", [])
        t_depth = gauge("topic_depth", "Messages a topic holds for channels to come "
                        "(while it has none or is paused).", _TOPIC)
        t_paused = gauge("topic_paused", "1 if the topic is paused.", _TOPIC)
        t_messages = counter("topic_messages", "Messages published to the topic.", _TOPIC)
        t_bytes = counter("topic_message_bytes", "Bytes of message bodies published to the "
                          "topic.", _TOPIC)
        t_read_errors = counter("topic_disk_read_errors", "Reads of the topic's messages "
                                "waiting on disk that failed (EMFILE, EIO, ...); each is "
                                "retried, nothing is lost.", _TOPIC)
        c_depth = gauge("channel_depth", "Messages ready in the channel (not in flight, "
                        "not deferred).", _CHANNEL)
        c_in_flight = gauge("channel_in_flight", "Messages sent and not yet FINished, "
                            "requeued or timed out.", _CHANNEL)
        c_deferred = gauge("channel_deferred", "Messages waiting out a REQ or DPUB delay.",
                           _CHANNEL)
        c_lag = gauge("channel_lag", "Messages the channel received and has not FINished "
                      "yet: ready, in flight and deferred (a consumer's lag, as Kafka's "
                      "records-lag, in messages).", _CHANNEL)
        c_clients = gauge("channel_clients", "Consumers subscribed to the channel.", _CHANNEL)
        c_paused = gauge("channel_paused", "1 if the channel is paused.", _CHANNEL)
        c_messages = counter("channel_messages", "Messages the channel received.", _CHANNEL)
        c_finished = counter("channel_finished", "Messages FINished.", _CHANNEL)
        c_requeued = counter("channel_requeued", "Messages requeued (REQ, or their holder "
                             "went away).", _CHANNEL)
        c_timed_out = counter("channel_timed_out", "Messages whose in-flight timeout passed.",
                              _CHANNEL)
        c_dead = counter("channel_dead_letters", "Messages moved to the dead-letter topic "
                         "(past max attempts, or expired).", _CHANNEL)
        c_expired = counter("channel_expired", "Messages past their ttl (dead-lettered, or "
                            "dropped when the channel keeps no dead letters).", _CHANNEL)
        c_latency = HistogramMetricFamily(
            f"{PREFIX}_channel_e2e_processing_latency_seconds",
            "Time from publish to FIN of the channel's messages.", labels=_CHANNEL)

        stats = self.broker.stats()
        topics.add_metric([], len(stats))
        for t in stats:
            t_depth.add_metric([t.name], t.depth)
            t_paused.add_metric([t.name], int(t.paused))
            t_messages.add_metric([t.name], t.message_count)
            t_bytes.add_metric([t.name], t.message_bytes)
            t_read_errors.add_metric([t.name], t.disk_read_errors)
            core_channels = self.broker.topics[t.name].channels
            for c in t.channels:
                labels = [t.name, c.name]
                c_depth.add_metric(labels, c.depth)
                c_in_flight.add_metric(labels, c.in_flight_count)
                c_deferred.add_metric(labels, c.deferred_count)
                c_lag.add_metric(labels, c.depth + c.in_flight_count + c.deferred_count)
                c_clients.add_metric(labels, len(c.clients))
                c_paused.add_metric(labels, int(c.paused))
                c_messages.add_metric(labels, c.message_count)
                c_finished.add_metric(labels, c.finish_count)
                c_requeued.add_metric(labels, c.requeue_count)
                c_timed_out.add_metric(labels, c.timeout_count)
                c_dead.add_metric(labels, c.dead_letter_count)
                c_expired.add_metric(labels, c.expired_count)
                latency = core_channels[c.name].latency  # the histogram is not in the stats
                c_latency.add_metric(labels, *_histogram(latency.bucket_counts,
                                                         latency.sum_ms))
        yield from (topics, t_depth, t_paused, t_messages, t_bytes, t_read_errors, c_depth,
                    c_in_flight, c_deferred, c_lag, c_clients, c_paused, c_messages, c_finished,
                    c_requeued, c_timed_out, c_dead, c_expired, c_latency)


def _histogram(counts: list[int], sum_ms: float) -> tuple[list[tuple[str, float]], float]:
    """Per-bucket counts (ms) -> Prometheus' cumulative buckets (seconds) and sum."""
    buckets, total = [], 0
    for bound, count in zip((*HISTOGRAM_BOUNDS_MS, None), counts):
        total += count
        buckets.append(("+Inf" if bound is None else repr(bound / 1000), total))
    return buckets, sum_ms / 1000


def registry_for(broker: Broker) -> CollectorRegistry:
    """A registry of the broker's metrics, the process's and the Python runtime's."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format."""
    return generate_latest(registry)
