from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PublishRequest(_message.Message):
    __slots__ = ("topic", "body", "defer_ms", "producer_id", "sequence", "ttl_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    DEFER_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    body: bytes
    defer_ms: int
    producer_id: str
    sequence: int
    ttl_ms: int
    def __init__(self, topic: _Optional[str] = ..., body: _Optional[bytes] = ..., defer_ms: _Optional[int] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class MultiPublishRequest(_message.Message):
    __slots__ = ("topic", "bodies", "defer_ms", "producer_id", "sequence", "ttl_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    DEFER_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    bodies: _containers.RepeatedScalarFieldContainer[bytes]
    defer_ms: _containers.RepeatedScalarFieldContainer[int]
    producer_id: str
    sequence: int
    ttl_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., bodies: _Optional[_Iterable[bytes]] = ..., defer_ms: _Optional[_Iterable[int]] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., ttl_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("id", "body", "timestamp", "attempts")
    ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    body: bytes
    timestamp: int
    attempts: int
    def __init__(self, id: _Optional[str] = ..., body: _Optional[bytes] = ..., timestamp: _Optional[int] = ..., attempts: _Optional[int] = ...) -> None: ...

class Messages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class MessageColumns(_message.Message):
    __slots__ = ("count", "ids", "bodies", "body_offsets", "timestamps", "attempts")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    BODY_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    count: int
    ids: bytes
    bodies: bytes
    body_offsets: bytes
    timestamps: bytes
    attempts: bytes
    def __init__(self, count: _Optional[int] = ..., ids: _Optional[bytes] = ..., bodies: _Optional[bytes] = ..., body_offsets: _Optional[bytes] = ..., timestamps: _Optional[bytes] = ..., attempts: _Optional[bytes] = ...) -> None: ...

class ClientFrame(_message.Message):
    __slots__ = ("sub", "rdy", "fin", "req", "touch", "cls", "nop")
    SUB_FIELD_NUMBER: _ClassVar[int]
    RDY_FIELD_NUMBER: _ClassVar[int]
    FIN_FIELD_NUMBER: _ClassVar[int]
    REQ_FIELD_NUMBER: _ClassVar[int]
    TOUCH_FIELD_NUMBER: _ClassVar[int]
    CLS_FIELD_NUMBER: _ClassVar[int]
    NOP_FIELD_NUMBER: _ClassVar[int]
    sub: Sub
    rdy: Rdy
    fin: Fin
    req: Req
    touch: Touch
    cls: Cls
    nop: Nop
    def __init__(self, sub: _Optional[_Union[Sub, _Mapping]] = ..., rdy: _Optional[_Union[Rdy, _Mapping]] = ..., fin: _Optional[_Union[Fin, _Mapping]] = ..., req: _Optional[_Union[Req, _Mapping]] = ..., touch: _Optional[_Union[Touch, _Mapping]] = ..., cls: _Optional[_Union[Cls, _Mapping]] = ..., nop: _Optional[_Union[Nop, _Mapping]] = ...) -> None: ...

class Sub(_message.Message):
    __slots__ = ("topic", "channel", "msg_timeout_ms", "client_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    MSG_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    channel: str
    msg_timeout_ms: int
    client_id: str
    def __init__(self, topic: _Optional[str] = ..., channel: _Optional[str] = ..., msg_timeout_ms: _Optional[int] = ..., client_id: _Optional[str] = ...) -> None: ...

class Rdy(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class Fin(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Req(_message.Message):
    __slots__ = ("id", "delay_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    delay_ms: int
    def __init__(self, id: _Optional[str] = ..., delay_ms: _Optional[int] = ...) -> None: ...

class Touch(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Cls(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Nop(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerFrame(_message.Message):
    __slots__ = ("subscribed", "messages", "error", "close_wait", "heartbeat")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CLOSE_WAIT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    messages: Messages
    error: Error
    close_wait: CloseWait
    heartbeat: Heartbeat
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., messages: _Optional[_Union[Messages, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., close_wait: _Optional[_Union[CloseWait, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("msg_timeout_ms", "max_rdy_count")
    MSG_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_RDY_COUNT_FIELD_NUMBER: _ClassVar[int]
    msg_timeout_ms: int
    max_rdy_count: int
    def __init__(self, msg_timeout_ms: _Optional[int] = ..., max_rdy_count: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("status_code", "code", "message", "id")
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    status_code: int
    code: str
    message: str
    id: str
    def __init__(self, status_code: _Optional[int] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class CloseWait(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TopicRequest(_message.Message):
    __slots__ = ("topic", "ttl_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    ttl_ms: int
    def __init__(self, topic: _Optional[str] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class ChannelRequest(_message.Message):
    __slots__ = ("topic", "channel", "max_attempts", "dead_letter_topic")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    channel: str
    max_attempts: int
    dead_letter_topic: str
    def __init__(self, topic: _Optional[str] = ..., channel: _Optional[str] = ..., max_attempts: _Optional[int] = ..., dead_letter_topic: _Optional[str] = ...) -> None: ...

class AdminResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("topic", "channel")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    topic: str
    channel: str
    def __init__(self, topic: _Optional[str] = ..., channel: _Optional[str] = ...) -> None: ...

class Percentile(_message.Message):
    __slots__ = ("quantile", "value_ms")
    QUANTILE_FIELD_NUMBER: _ClassVar[int]
    VALUE_MS_FIELD_NUMBER: _ClassVar[int]
    quantile: float
    value_ms: float
    def __init__(self, quantile: _Optional[float] = ..., value_ms: _Optional[float] = ...) -> None: ...

class ClientStats(_message.Message):
    __slots__ = ("client_id", "ready_count", "in_flight_count", "message_count", "finish_count", "requeue_count")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    READY_COUNT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    FINISH_COUNT_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    def __init__(self, client_id: _Optional[str] = ..., ready_count: _Optional[int] = ..., in_flight_count: _Optional[int] = ..., message_count: _Optional[int] = ..., finish_count: _Optional[int] = ..., requeue_count: _Optional[int] = ...) -> None: ...

class ChannelStats(_message.Message):
    __slots__ = ("name", "depth", "in_flight_count", "deferred_count", "message_count", "requeue_count", "timeout_count", "paused", "clients", "e2e_processing_latency", "finish_count", "dead_letter_count", "expired_count", "on_disk_count", "disk_bytes", "max_attempts", "dead_letter_topic")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_COUNT_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    E2E_PROCESSING_LATENCY_FIELD_NUMBER: _ClassVar[int]
    FINISH_COUNT_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_COUNT_FIELD_NUMBER: _ClassVar[int]
    ON_DISK_COUNT_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    name: str
    depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    paused: bool
    clients: _containers.RepeatedCompositeFieldContainer[ClientStats]
    e2e_processing_latency: _containers.RepeatedCompositeFieldContainer[Percentile]
    finish_count: int
    dead_letter_count: int
    expired_count: int
    on_disk_count: int
    disk_bytes: int
    max_attempts: int
    dead_letter_topic: str
    def __init__(self, name: _Optional[str] = ..., depth: _Optional[int] = ..., in_flight_count: _Optional[int] = ..., deferred_count: _Optional[int] = ..., message_count: _Optional[int] = ..., requeue_count: _Optional[int] = ..., timeout_count: _Optional[int] = ..., paused: _Optional[bool] = ..., clients: _Optional[_Iterable[_Union[ClientStats, _Mapping]]] = ..., e2e_processing_latency: _Optional[_Iterable[_Union[Percentile, _Mapping]]] = ..., finish_count: _Optional[int] = ..., dead_letter_count: _Optional[int] = ..., expired_count: _Optional[int] = ..., on_disk_count: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., max_attempts: _Optional[int] = ..., dead_letter_topic: _Optional[str] = ...) -> None: ...

class TopicStats(_message.Message):
    __slots__ = ("name", "depth", "message_count", "message_bytes", "paused", "channels", "e2e_processing_latency", "on_disk_count", "disk_bytes", "ttl_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    E2E_PROCESSING_LATENCY_FIELD_NUMBER: _ClassVar[int]
    ON_DISK_COUNT_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    depth: int
    message_count: int
    message_bytes: int
    paused: bool
    channels: _containers.RepeatedCompositeFieldContainer[ChannelStats]
    e2e_processing_latency: _containers.RepeatedCompositeFieldContainer[Percentile]
    on_disk_count: int
    disk_bytes: int
    ttl_ms: int
    def __init__(self, name: _Optional[str] = ..., depth: _Optional[int] = ..., message_count: _Optional[int] = ..., message_bytes: _Optional[int] = ..., paused: _Optional[bool] = ..., channels: _Optional[_Iterable[_Union[ChannelStats, _Mapping]]] = ..., e2e_processing_latency: _Optional[_Iterable[_Union[Percentile, _Mapping]]] = ..., on_disk_count: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("topics", "start_time", "version")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicStats]
    start_time: int
    version: str
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicStats, _Mapping]]] = ..., start_time: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: str
    def __init__(self, status: _Optional[str] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("version", "grpc_address", "start_time", "max_msg_size", "max_rdy_count", "msg_timeout_ms", "max_msg_timeout_ms", "max_req_timeout_ms", "durable", "workers", "reserve_finishes", "identity", "node_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_MSG_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_RDY_COUNT_FIELD_NUMBER: _ClassVar[int]
    MSG_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MSG_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_REQ_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FINISHES_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    version: str
    grpc_address: str
    start_time: int
    max_msg_size: int
    max_rdy_count: int
    msg_timeout_ms: int
    max_msg_timeout_ms: int
    max_req_timeout_ms: int
    durable: bool
    workers: _containers.RepeatedScalarFieldContainer[str]
    reserve_finishes: bool
    identity: str
    node_id: int
    def __init__(self, version: _Optional[str] = ..., grpc_address: _Optional[str] = ..., start_time: _Optional[int] = ..., max_msg_size: _Optional[int] = ..., max_rdy_count: _Optional[int] = ..., msg_timeout_ms: _Optional[int] = ..., max_msg_timeout_ms: _Optional[int] = ..., max_req_timeout_ms: _Optional[int] = ..., durable: _Optional[bool] = ..., workers: _Optional[_Iterable[str]] = ..., reserve_finishes: _Optional[bool] = ..., identity: _Optional[str] = ..., node_id: _Optional[int] = ...) -> None: ...

class LeaseSessionRequest(_message.Message):
    __slots__ = ("client_id", "session_id", "grace_ms")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    session_id: str
    grace_ms: int
    def __init__(self, client_id: _Optional[str] = ..., session_id: _Optional[str] = ..., grace_ms: _Optional[int] = ...) -> None: ...

class LeaseSessionEvent(_message.Message):
    __slots__ = ("session_id", "heartbeat", "broker_id", "resumed")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    heartbeat: Heartbeat
    broker_id: str
    resumed: bool
    def __init__(self, session_id: _Optional[str] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., broker_id: _Optional[str] = ..., resumed: _Optional[bool] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("session_id", "topic", "channel", "max_messages", "msg_timeout_ms", "max_bytes", "finish_lease_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MSG_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    FINISH_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    topic: str
    channel: str
    max_messages: int
    msg_timeout_ms: int
    max_bytes: int
    finish_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., topic: _Optional[str] = ..., channel: _Optional[str] = ..., max_messages: _Optional[int] = ..., msg_timeout_ms: _Optional[int] = ..., max_bytes: _Optional[int] = ..., finish_lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("lease_id", "count", "depth", "bytes", "finished", "missing")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    count: int
    depth: int
    bytes: int
    finished: int
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_id: _Optional[str] = ..., count: _Optional[int] = ..., depth: _Optional[int] = ..., bytes: _Optional[int] = ..., finished: _Optional[int] = ..., missing: _Optional[_Iterable[str]] = ...) -> None: ...

class FetchLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "partition", "num_partitions", "broker_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    partition: int
    num_partitions: int
    broker_id: str
    def __init__(self, lease_id: _Optional[str] = ..., partition: _Optional[int] = ..., num_partitions: _Optional[int] = ..., broker_id: _Optional[str] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("lease_ids",)
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AdoptLeasesRequest(_message.Message):
    __slots__ = ("session_id", "lease_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("count", "missing")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    count: int
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, count: _Optional[int] = ..., missing: _Optional[_Iterable[str]] = ...) -> None: ...
