"""Bad requests over gRPC: each gets a status whose message names what was
wrong, FIN/REQ/TOUCH failures leave the stream open, and everyone else goes on."""

from __future__ import annotations

import grpc
import pytest

from broker import Client, ClientError, EmbeddedBroker
from broker.api import broker_pb2 as pb
from broker.errors import (ERROR_CODE_METADATA, BrokerError, InvalidChannel, InvalidMessage,
                           InvalidTopic, NotInFlight, TopicNotFound, error_for_code)

from .helpers import wait_for
from .grpckit import channel_stats, collect

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


@pytest.fixture
def broker():
    """Small limits, so that going over them is cheap (conftest's ``client`` uses it)."""
    with EmbeddedBroker(max_msg_size=100, max_rdy_count=50, max_msg_timeout="10s",
                        msg_timeout="5s", max_req_timeout="10s") as b:
        yield b


@pytest.fixture
def bystander(client):
    """A consumer on another topic that must keep being served throughout."""
    sub = client.subscribe("other", "watch", rdy=10)
    yield sub
    client.publish("other", "still here")
    [(_, msg)] = collect([sub], 1)
    assert msg.body == b"still here"
    sub.close()


BAD_REQUESTS = [
    ("publish to a bad topic name", lambda c: c.publish("bad topic", "x"), INVALID,
     "invalid topic name 'bad topic'"),
    ("publish an empty body", lambda c: c.publish("events", b""), INVALID, "empty body"),
    ("publish an oversize body", lambda c: c.publish("events", b"x" * 101), INVALID,
     "body of 101 bytes is over the max-msg-size of 100"),
    ("multi-publish with one oversize body", lambda c: c.multi_publish("events", ["a", "x" * 101]),
     INVALID, "message 1: body of 101 bytes"),
    ("multi-publish nothing", lambda c: c.multi_publish("events", []), INVALID, "no messages"),
    ("defer beyond max-req-timeout", lambda c: c.publish("events", "x", defer_ms=10_001),
     INVALID, "DPUB defer 10001 ms out of range"),
    ("subscribe with a bad channel name", lambda c: c.subscribe("events", "a/b"), INVALID,
     "SUB: invalid channel name 'a/b'"),
    ("subscribe with a timeout over max-msg-timeout",
     lambda c: c.subscribe("events", "work", msg_timeout_ms=10_001), INVALID,
     "max-msg-timeout of 10000 ms"),
    ("pause a missing topic", lambda c: c.admin("topic", "pause", "nope"), NOT_FOUND,
     "topic nope does not exist"),
    ("empty a missing channel", lambda c: c.admin("channel", "empty", "other", "nope"), NOT_FOUND,
     "channel other/nope does not exist"),
    ("create a channel with a bad name", lambda c: c.admin("channel", "create", "events", "#x"),
     INVALID, "invalid channel name '#x'"),
    ("stats of a missing topic", lambda c: c.stats("nope"), NOT_FOUND, "topic nope does not exist"),
]


@pytest.mark.parametrize("call, status, message",
                         [r[1:] for r in BAD_REQUESTS], ids=[r[0] for r in BAD_REQUESTS])
def test_bad_request_gets_a_status_naming_what_was_wrong(client, bystander, call, status, message):
    with pytest.raises(ClientError) as err:
        call(client)
    assert err.value.status == status
    assert message in str(err.value)


@pytest.mark.parametrize("bodies, text", [
    ([b""], "empty body"),
    ([b"a", b""], "message 1: empty body"),
    ([b"x" * 101], "body of 101 bytes is over the max-msg-size of 100 bytes"),
    ([b"a", b"x" * 101], "message 1: body of 101 bytes is over the max-msg-size of 100 bytes"),
])
def test_a_refused_body_is_named_by_its_index_only_among_several(client, bystander, bodies,
                                                                  text):
    for publish in (lambda: client.multi_publish("events", bodies),
                    *([lambda: client.publish("events", bodies[0])] if len(bodies) == 1 else [])):
        with pytest.raises(ClientError) as err:
            publish()
        assert str(err.value) == text


def test_refused_publish_leaves_nothing_behind(client, bystander):
    with pytest.raises(ClientError):
        client.multi_publish("events", ["a", "x" * 101])
    assert [t.name for t in client.stats().topics] == ["other"]


def test_rdy_out_of_range_ends_only_that_stream(client, bystander):
    sub = client.subscribe("events", "work", rdy=0)
    sub.rdy(51)
    with pytest.raises(ClientError, match="RDY 51 out of range: must be 0 to 50") as err:
        sub.get(timeout=5)
    assert err.value.status == INVALID
    sub.close()


@pytest.mark.parametrize("command", ["fin", "req", "touch"])
def test_command_on_an_unknown_message_is_an_error_frame_and_the_stream_goes_on(
        client, bystander, command):
    with client.subscribe("events", "work", rdy=5) as sub:
        getattr(sub, command)("0123456789abcdef")
        error = sub.error(timeout=5)
        assert error.code == f"E_{command.upper()}_FAILED"
        assert error.id == "0123456789abcdef"
        assert "0123456789abcdef: message not in flight for this consumer" in error.message
        assert error.status_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        msg_id = client.publish("events", "after the error")
        [(_, msg)] = collect([sub], 1)
    assert msg.id == msg_id


@pytest.mark.parametrize("command", ["fin", "req", "touch"])
def test_command_on_a_message_another_consumer_holds_changes_nothing(client, bystander, command):
    with client.subscribe("events", "work", rdy=1) as holder, \
            client.subscribe("events", "work", rdy=0) as other:
        msg_id = client.publish("events", "mine")
        [(_, msg)] = collect([holder], 1, fin=False)
        getattr(other, command)(msg_id)
        assert other.error(timeout=5).code == f"E_{command.upper()}_FAILED"
        assert channel_stats(client, "events", "work").in_flight_count == 1
        holder.fin(msg.id)
        wait_for(lambda: channel_stats(client, "events", "work").finish_count == 1)
        # No error reached the holder: a sentinel error it provokes now is the first it gets.
        holder.fin("ffffffffffffffff")
        assert holder.error(timeout=5).id == "ffffffffffffffff"


def test_req_delay_out_of_range_is_an_error_frame_and_the_message_stays_held(client, bystander):
    with client.subscribe("events", "work", rdy=1) as sub:
        client.publish("events", "x")
        [(_, msg)] = collect([sub], 1, fin=False)
        sub.req(msg.id, delay_ms=10_001)
        error = sub.error(timeout=5)
        assert error.code == "E_INVALID" and "REQ delay 10001 ms out of range" in error.message
        sub.fin(msg.id)
        wait_for(lambda: channel_stats(client, "events", "work").finish_count == 1)


def test_stream_whose_first_frame_is_not_sub_is_refused(client, bystander):
    frames = iter([pb.ClientFrame(rdy=pb.Rdy(count=1))])
    with pytest.raises(grpc.RpcError) as err:
        list(client.stub.Subscribe(frames, timeout=5))
    assert err.value.code() == INVALID
    assert "the first frame must be SUB, got rdy" in err.value.details()


def test_second_sub_on_a_stream_is_refused(client, bystander):
    sub = pb.ClientFrame(sub=pb.Sub(topic="events", channel="work"))
    with pytest.raises(grpc.RpcError) as err:
        list(client.stub.Subscribe(iter([sub, sub]), timeout=5))
    assert err.value.code() == INVALID
    assert "SUB: this stream is already subscribed" in err.value.details()
    assert dict(err.value.trailing_metadata())[ERROR_CODE_METADATA] == "E_INVALID"


def test_an_empty_command_frame_ends_the_stream_naming_it(client, bystander):
    sub = pb.ClientFrame(sub=pb.Sub(topic="events", channel="work"))
    with pytest.raises(grpc.RpcError) as err:
        list(client.stub.Subscribe(iter([sub, pb.ClientFrame()]), timeout=5))
    assert err.value.code() == INVALID
    assert "empty command frame" in err.value.details()


RAW_BAD_CALLS = [
    ("publish to a bad topic name",
     lambda stub: stub.Publish(pb.PublishRequest(topic="bad\n", body=b"x"), timeout=5),
     InvalidTopic, "E_BAD_TOPIC"),
    ("publish an empty body",
     lambda stub: stub.Publish(pb.PublishRequest(topic="events", body=b""), timeout=5),
     InvalidMessage, "E_BAD_MESSAGE"),
    ("pause a missing topic",
     lambda stub: stub.PauseTopic(pb.TopicRequest(topic="nope"), timeout=5),
     TopicNotFound, "E_TOPIC_NOT_FOUND"),
    ("subscribe with a bad channel name",
     lambda stub: list(stub.Subscribe(iter([pb.ClientFrame(sub=pb.Sub(topic="t", channel="a/b"))]),
                                      timeout=5)),
     InvalidChannel, "E_BAD_CHANNEL"),
]


@pytest.mark.parametrize("call, cls, code", [r[1:] for r in RAW_BAD_CALLS],
                         ids=[r[0] for r in RAW_BAD_CALLS])
def test_every_error_status_carries_the_brokers_code_and_rebuilds_as_that_error(
        client, bystander, call, cls, code):
    with pytest.raises(grpc.RpcError) as caught:
        call(client.stub)
    sent = dict(caught.value.trailing_metadata())[ERROR_CODE_METADATA]
    rebuilt = error_for_code(sent, caught.value.details())
    assert (sent, type(rebuilt), rebuilt.message) == (code, cls, caught.value.details())


def test_error_for_code_rebuilds_not_in_flight_and_keeps_unknown_codes():
    assert isinstance(error_for_code("E_REQ_FAILED", "gone"), NotInFlight)
    assert error_for_code("E_REQ_FAILED", "gone").fatal is False
    other = error_for_code("E_SOMETHING_NEW", "why")
    assert (type(other), other.code, other.message) == (BrokerError, "E_SOMETHING_NEW", "why")


def test_a_request_over_max_body_size_is_refused_and_others_are_served():
    with EmbeddedBroker(max_body_size=10_000) as broker, Client(broker.address) as client:
        with client.subscribe("other", "watch", rdy=10) as watcher:
            with pytest.raises(ClientError) as err:
                client.multi_publish("events", [b"x" * 100] * 200)
            assert err.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert [t.name for t in client.stats().topics] == ["other"]
            assert len(client.multi_publish("events", [b"x" * 100] * 50)) == 50
            client.publish("other", "still here")
            [(_, msg)] = collect([watcher], 1)
            assert msg.body == b"still here"
