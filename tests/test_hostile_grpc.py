"""Hostile gRPC clients: a Subscribe stream that never reads, many streams on one
HTTP/2 connection, very large metadata. Each is bounded, and the broker keeps serving
everyone else."""

from __future__ import annotations

import logging
import queue

import grpc
import pytest

from broker import Client, EmbeddedBroker
from broker.api import broker_pb2 as pb
from broker.api import broker_pb2_grpc as pb_grpc
from broker.server import grpc_server

from .grpckit import channel_stats
from .helpers import wait_for

BODY = b"b" * (64 << 10)


def subscribe(stub, topic: str, channel: str, *, rdy: int, msg_timeout_ms: int = 0):
    frames: queue.Queue = queue.Queue()
    frames.put(pb.ClientFrame(sub=pb.Sub(topic=topic, channel=channel,
                                         msg_timeout_ms=msg_timeout_ms)))
    frames.put(pb.ClientFrame(rdy=pb.Rdy(count=rdy)))
    stream = stub.Subscribe(iter(frames.get, None))
    return stream, frames


def test_a_subscribe_stream_that_never_reads_is_cut_after_its_message_timeout_and_requeued(
        caplog):
    """The stall timer: a consumer whose stream takes nothing (its HTTP/2 window full,
    the broker's stream buffer full) for its message timeout is disconnected, and what
    it held goes back to the channel for others."""
    caplog.set_level(logging.INFO)
    with EmbeddedBroker() as broker, Client(broker.address) as client, \
            grpc.insecure_channel(broker.address) as channel:
        stream, frames = subscribe(pb_grpc.BrokerStub(channel), "t", "ch", rdy=2500,
                                   msg_timeout_ms=1000)
        assert next(stream).HasField("subscribed")      # then never read again
        wait_for(lambda: len(channel_stats(client, "t", "ch").clients) == 1, 10)
        published = []
        for _ in range(8):      # 32 MiB: more than the windows and the stream buffer
            published += client.multi_publish("t", [BODY] * 64)
        wait_for(lambda: len(channel_stats(client, "t", "ch").clients) == 0, 30, 0.1,
                 "the stuck consumer disconnected")
        stats = channel_stats(client, "t", "ch")
        assert stats.in_flight_count == 0 and stats.depth == len(published)
        assert any("has not read its stream" in r.getMessage() for r in caplog.records)
        frames.put(None)
        stream.cancel()
        # Everything it held is delivered to a consumer that reads.
        with client.subscribe("t", "ch", rdy=2500) as sub:
            got = set()
            while len(got) < len(published):
                msg = sub.get(10)
                assert msg is not None, f"{len(got)} of {len(published)} redelivered"
                got.add(msg.id)
                sub.fin(msg.id)
        assert got == set(published)


def test_streams_on_one_http2_connection_are_capped_and_the_rest_wait():
    cap = grpc_server.MAX_STREAMS_PER_CONNECTION
    with EmbeddedBroker() as broker, Client(broker.address) as client, \
            grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        streams = [subscribe(stub, "t", "ch", rdy=1) for _ in range(cap + 20)]
        try:
            wait_for(lambda: len(channel_stats(client, "t", "ch").clients) == cap, 30, 0.1,
                     f"{cap} streams served")
            # The others wait (on the client's side) rather than fail; another
            # connection is served meanwhile.
            with Client(broker.address) as other:
                other.publish("t", b"x")
            assert len(channel_stats(client, "t", "ch").clients) == cap
            for stream, frames in streams[:40]:
                frames.put(None)
                stream.cancel()
            # Streams that end give their places back to the connection's calls.
            wait_for(lambda: len(channel_stats(client, "t", "ch").clients) < cap, 30, 0.1,
                     "streams ended")
            assert stub.Ping(pb.PingRequest(), timeout=10).status == "OK"
        finally:
            for stream, frames in streams:
                frames.put(None)
                stream.cancel()


def test_metadata_over_its_bound_is_refused_and_others_are_served():
    with EmbeddedBroker() as broker, grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        big = "v" * (grpc_server.MAX_METADATA_BYTES + 1024)
        with pytest.raises(grpc.RpcError) as err:
            stub.Ping(pb.PingRequest(), metadata=[("x-big", big)], timeout=10)
        assert err.value.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    grpc.StatusCode.INTERNAL), err.value
        assert stub.Ping(pb.PingRequest(), timeout=10).status == "OK"
        small = "v" * (grpc_server.MAX_METADATA_BYTES // 2)
        assert stub.Ping(pb.PingRequest(), metadata=[("x-ok", small)], timeout=10).status \
            == "OK"
