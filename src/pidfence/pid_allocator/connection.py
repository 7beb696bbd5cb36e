"""One client connection of a lease server, as an asyncio protocol.

A protocol (not streams) because a lease is answered in the event loop's own callbacks with no
coroutine switch, which is most of a request's cost in Python. The replies answered in one turn
go out in one ``transport.write`` (one send, one TLS record, for a client that pipelines).

Counted from accept (``admission.py``): the server accepts plain TCP and starts TLS itself
(``tls_start.py``, with a handshake deadline), so a connection holds a pending slot from its
first byte, through its handshake and until ``hello``; only then does it take an admitted one.
Before that its frames are at most ``max_pre_auth_frame_bytes``, and the whole pending phase must
end within ``hello_timeout_s``.

Bounded and fair (``fair.py``): a connection holding a whole frame waits in its client's line
and is not read meanwhile (backpressure onto the client's TCP window); the server answers one
frame per client in turn, and a client with ``max_in_flight`` requests being answered waits until
one is. A client that does not read its replies stops being read too.

Timeouts: idle ``idle_timeout_s``; a started frame must finish within ``frame_timeout_s``. A frame
over the limit gets MALFORMED_REQUEST, then the connection is closed (the stream cannot be
resynchronised), and so does any UNAUTHENTICATED reply or decode-limit break.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Coroutine
from typing import Any, Protocol, cast

from pidfence.pid_allocator.admission import STAGE_NEW
from pidfence.pid_allocator.audit import FRAME_LIMIT, PENDING_TIMEOUT, TLS_FAILED
from pidfence.pid_allocator.decode import MAX_FRAME_BYTES
from pidfence.pid_allocator.errors import FrameLimitExceeded, LeaseServiceUnavailable
from pidfence.pid_allocator.fair import Turns
from pidfence.pid_allocator.protocol import LENGTH, Request, RequestId, encode_frame, error_reply
from pidfence.pid_allocator.settings import LeaseServerSettings
from pidfence.pid_allocator.tls_start import TlsStart


class ConnectionHost(Protocol):
    """What a connection needs from its server (``server.LeaseServer`` is one)."""

    settings: LeaseServerSettings
    tls: ssl.SSLContext | None
    turns: Turns

    @property
    def auth_required(self) -> bool:
        """Whether connections must ``hello`` first."""
        ...

    def accept(self, connection: LeaseConnection) -> str | None:
        """Count a new connection; None, or why it is refused."""
        ...

    def admit(self, connection: LeaseConnection, client: str | None = None) -> str | None:
        """Move it to the admitted pool (as ``client``'s, a token's name); None, or why it is
        refused."""
        ...

    def advance(self, connection: LeaseConnection) -> None:
        """It finished its TLS handshake or sent its first bytes."""
        ...

    def release(self, connection: LeaseConnection) -> None:
        """It closed (idempotent)."""
        ...

    def note(self, event: str, connection: LeaseConnection, detail: str = "") -> None:
        """Audit a refusal."""
        ...

    def handle_now(self, connection: LeaseConnection, body: bytes) -> bytes | Request:
        """The reply frame, or the request to answer later."""
        ...

    def handle(
        self, connection: LeaseConnection, request: Request
    ) -> Coroutine[Any, Any, dict[str, Any]]:
        """The reply to a request that waits."""
        ...

    def encode(self, reply: dict[str, Any]) -> bytes:
        """A reply as a frame."""
        ...

    def error_reply(self, request_id: RequestId, error: Exception) -> dict[str, Any]:
        """An error reply map."""
        ...


class LeaseConnection(asyncio.Protocol):
    """Frames in, replies out, for one client."""

    def __init__(self, server: ConnectionHost) -> None:
        self.server = server
        self.settings = server.settings
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.address = "?"
        self.client = "addr:?"
        #: Admission stage while pending (``admission.STAGE_*``).
        self.stage = STAGE_NEW
        self.pending = True
        self.authenticated = not server.auth_required
        self.max_frame = self.settings.max_pre_auth_frame_bytes
        self._buffer = bytearray()
        self._replies: list[bytes] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._handshake: TlsStart | None = None
        self._reading_paused = False
        self._writing_paused = False
        #: In its client's line (``fair.Turns``).
        self.queued = False
        self._opened = self.loop.time()
        self._last_activity = self._opened
        self._partial_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        #: Set by the server when a reply must be the last one (UNAUTHENTICATED).
        self.close_after_reply = False

    @property
    def in_flight(self) -> int:
        """Requests of this connection being answered now."""
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        """Whether the connection is closed or closing."""
        return self._closed

    def admitted(self, name: str | None = None) -> None:
        """The connection is admitted (``hello`` succeeded as client ``name``, or no auth)."""
        self.pending = False
        self.authenticated = True
        self.max_frame = MAX_FRAME_BYTES
        if name is not None:
            self.client = f"token:{name}"

    # -- asyncio callbacks ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Count the connection from accept; start TLS, or admit it when nothing is pending."""
        # TCP only; uvloop's transports do not subclass asyncio.Transport, hence no isinstance.
        self.transport = raw = cast(asyncio.Transport, transport)
        peer = raw.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self.client = f"addr:{self.address}"
        refused = self.server.accept(self)
        if refused is None and self.server.tls is None and not self.server.auth_required:
            refused = self.admit_as()
        if refused is not None:
            if self.server.tls is None:
                raw.write(encode_frame(error_reply(None, LeaseServiceUnavailable.code, refused)))
                raw.close()
            else:
                raw.abort()  # no TLS yet: nothing can be said to the peer
            self._closed = True
            return
        if self.server.tls is not None:
            self._handshake = TlsStart(
                self.loop,
                raw,
                self,
                self.server.tls,
                self.settings.tls_handshake_timeout_s,
                self._tls_started,
                self._tls_failed,
            )
        self._arm_timer(self._next_check())

    def admit_as(self, name: str | None = None) -> str | None:
        """Take an admitted slot (as client ``name`` after ``hello``); None, or why not."""
        refused = self.server.admit(self, name)
        if refused is None:
            self.admitted(name)
        return refused

    def _tls_failed(self) -> None:
        if not self._closed:  # failed on its own, not abandoned by abort()
            self.server.note(
                TLS_FAILED,
                self,
                "TLS handshake failed: a client without TLS, or one that does not trust this "
                "server's certificate (clients: $PIDFENCE_LEASE_TLS_CA or --tls-ca)",
            )
        self._closed = True  # the raw transport is aborted: connection_lost releases the slot

    def _tls_started(self, secured: asyncio.Transport) -> None:
        if self._closed:
            return
        self.transport = secured
        self.server.advance(self)
        if not self.server.auth_required:
            refused = self.admit_as()
            if refused is not None:
                secured.write(
                    encode_frame(error_reply(None, LeaseServiceUnavailable.code, refused))
                )
                self.close()
                return
        self._arrived()

    def data_received(self, data: bytes) -> None:
        """Buffer; a whole frame joins the client's line (and stops the reading)."""
        if self._closed:
            return
        self._last_activity = self.loop.time()
        self._buffer += data
        if self._handshake is not None and self._handshake.running:
            # The handshake finished and the client's first request came with it, before
            # start_tls returned the TLS transport that replies must go to: answer it then.
            return
        if self.pending and self.stage == STAGE_NEW:
            self.server.advance(self)
        self._arrived()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection and cancel its waiting requests."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for task in self._tasks:
            task.cancel()
        self.server.release(self)

    def pause_writing(self) -> None:
        """The client is not reading its replies: stop answering (and reading) its requests."""
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        """The client caught up."""
        self._writing_paused = False
        self._arrived()

    # -- frames ---------------------------------------------------------------------------------

    def has_frame(self) -> bool:
        """Whether a whole frame, or a length over the limit, is buffered."""
        buffer = self._buffer
        if len(buffer) < 4:
            return False
        length = int(LENGTH.unpack_from(buffer)[0])
        return length > self.max_frame or len(buffer) >= 4 + length

    def _arrived(self) -> None:
        """Bytes came in (or the connection may be served again): join the client's line when a
        whole frame is here; read on only while none is."""
        if self._closed:
            return
        if not self.queued and not self._writing_paused and self.has_frame():
            self.server.turns.ready(self)  # may answer it at once
        self._track_partial(self.queued or self.has_frame())
        self._update_reading()

    def serve_one(self) -> None:
        """Answer the next frame (this connection's turn); its reply waits for :meth:`flush`."""
        buffer = self._buffer
        (length,) = LENGTH.unpack_from(buffer)
        if length > self.max_frame:
            self._refuse_frame(length)
            return
        body = bytes(buffer[4 : 4 + length])
        del buffer[: 4 + length]
        result = self.server.handle_now(self, body)
        if type(result) is bytes:
            self._replies.append(result)
            if self.close_after_reply:
                self.flush()
                self.close()
        else:
            self._spawn(result)  # type: ignore[arg-type]

    def drained(self) -> None:
        """No whole frame is buffered any more: read again (unless otherwise held)."""
        self._track_partial(False)
        self._update_reading()

    def flush(self) -> None:
        """Write the replies answered since the last flush, in one write."""
        replies = self._replies
        if replies and not self._closed and self.transport is not None:
            self.transport.write(replies[0] if len(replies) == 1 else b"".join(replies))
        replies.clear()

    def _refuse_frame(self, length: int) -> None:
        where = "before hello" if self.pending else "per frame"
        error = FrameLimitExceeded(
            f"frame of {length} bytes exceeds the {self.max_frame}-byte limit {where}"
        )
        self.server.note(FRAME_LIMIT, self, str(error))
        self._replies.append(self.server.encode(self.server.error_reply(None, error)))
        self.flush()
        self.close()

    def _track_partial(self, has_frame: bool) -> None:
        if not self._buffer or has_frame:
            self._partial_since = None
        elif self._partial_since is None:
            self._partial_since = self._last_activity  # a new frame started: its clock starts
            if self._timer is not None:
                self._timer.cancel()
            self._arm_timer(self._next_check())

    def _update_reading(self) -> None:
        if self.transport is None or self._closed:
            return
        # Stop reading while a whole frame waits its turn: the kernel buffers, then TCP pushes
        # back.
        busy = self._writing_paused or self.queued or len(self._buffer) > self.max_frame + 4
        if busy and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
        elif not busy and self._reading_paused:
            self.transport.resume_reading()
            self._reading_paused = False

    # -- internals ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the transport (replies already written are flushed first)."""
        if not self._closed and self.transport is not None:
            self._closed = True
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection now (evicted, or a pending deadline passed): nothing is flushed,
        its file descriptor is released at once."""
        if self._handshake is not None:
            self._closed = True  # an abandoned handshake is not a failed one: not audited
            self._handshake.cancel()
        if self.transport is not None:
            self._closed = True
            self.transport.abort()

    def _write(self, reply: dict[str, Any]) -> None:
        if not self._closed and self.transport is not None:
            self.transport.write(self.server.encode(reply))

    def _spawn(self, request: Request) -> None:
        client = self.server.turns.key(self)  # as it is now: a later hello may rename it
        self.server.turns.started(client)
        held = [client]  # emptied when its in-flight slot is given back
        task = self.loop.create_task(self._answer(request, held))
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._answered(done, held))

    def _give_back(self, held: list[str]) -> None:
        if held:
            self.server.turns.finished(held.pop())

    async def _answer(self, request: Request, held: list[str]) -> None:
        try:
            reply = await self.server.handle(self, request)
        finally:
            # Before the reply leaves: a client's next request, sent when this one is
            # answered, must find nothing of it in flight (one request at a time is free).
            self._give_back(held)
        self._write(reply)

    def _answered(self, task: asyncio.Task[None], held: list[str]) -> None:
        self._tasks.discard(task)
        self._give_back(held)  # a task cancelled before it ran
        if not task.cancelled() and task.exception() is not None:
            self.close()  # handle() never raises; if it did, this stream is not trustworthy

    def pending_tasks(self) -> set[asyncio.Task[None]]:
        """Requests still being answered (the server awaits them when it closes)."""
        return set(self._tasks)

    def _arm_timer(self, delay: float) -> None:
        self._timer = self.loop.call_later(max(delay, 0.01), self._check_timeouts)

    def _next_check(self) -> float:
        settings = self.settings
        now = self.loop.time()
        delay = settings.idle_timeout_s - (now - self._last_activity)
        if self._partial_since is not None:
            delay = min(delay, settings.frame_timeout_s - (now - self._partial_since))
        if self.pending:
            delay = min(delay, settings.hello_timeout_s - (now - self._opened))
        return delay

    def _check_timeouts(self) -> None:
        if self._closed:
            return
        settings = self.settings
        now = self.loop.time()
        if self.pending and now - self._opened >= settings.hello_timeout_s:
            self.server.note(PENDING_TIMEOUT, self, "no hello (or TLS handshake) in time")
            self.abort()  # never got in: do not hold a slot
            return
        if (
            self._partial_since is not None
            and now - self._partial_since >= settings.frame_timeout_s
        ):
            self.close()  # a frame started and never finished: a slow or broken sender
            return
        if not self._tasks and now - self._last_activity >= settings.idle_timeout_s:
            self.close()
            return
        delay = self._next_check()
        self._arm_timer(delay if delay > 0 else settings.idle_timeout_s)
