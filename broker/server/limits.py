"""What one client connection may make the broker hold, in one place.

Inbound, every protocol reads one request at a time and no more while it cannot go
on: a TCP connection holds at most one read from its socket (asyncio reads up to
256 KiB) plus one unfinished command (``--max-body-size`` and a command line), and
reads nothing while the broker waits on its behalf (an auth server's answer, a TLS
handshake); a gRPC call holds one request of at most ``--max-body-size``; an HTTP
request's body is read up to ``--max-body-size``.

Outbound, replies that cannot be sent stop the reading, as nsqd's writer blocks: a
TCP connection stops reading its client when a reply is queued while its socket
does not take its output (more than the client's ``output_buffer_size`` unsent);
a gRPC consumer stream stops reading requests while ``STREAM_REPLIES`` replies
wait. A client that does not read what it is sent for its message timeout
is disconnected; one whose unsent output passes ``MAX_UNSENT_BYTES`` (plus one
message of ``--max-msg-size``) is disconnected at once.
"""

from __future__ import annotations

#: Replies (error frames of a few dozen bytes, CLOSE_WAIT) a gRPC consumer stream may
#: have waiting to be sent: at it the stream reads no more requests until they are
#: sent. A FIN or TOUCH naming more ids runs in slices of this many (one slice's
#: errors can take the queue to twice it). Above max-rdy-count's default, so a FIN of
#: all a consumer holds is one slice.
STREAM_REPLIES = 4096
#: Most a TCP connection may have unsent, beyond one message of --max-msg-size
#: (messages and replies in the broker's buffers); past it the client is disconnected.
MAX_UNSENT_BYTES = 4 * 1024 * 1024
#: Seconds an HTTP client has to send a whole request's headers, counted from its
#: connecting or from the broker's last answer on the connection: an idle keep-alive
#: connection and one sending its headers slowly (or only half) are closed after it.
HTTP_IDLE_TIMEOUT = 30.0
#: Seconds an HTTP request has, once its headers are in, for its body and the broker's
#: answer: past it the client gets 408 ``REQUEST_TIMEOUT`` and the connection is
#: closed. With the headers' HTTP_IDLE_TIMEOUT, a whole request has at most their sum.
HTTP_BODY_TIMEOUT = 60.0
#: Seconds a client has to finish its TLS handshake (HTTPS, and TCP's upgrade after
#: IDENTIFY); past it the connection is closed.
TLS_HANDSHAKE_TIMEOUT = 10.0
