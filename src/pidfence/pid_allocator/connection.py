"""One client connection of a lease server, as an asyncio protocol.

A protocol (not streams) because a lease is answered straight from ``data_received`` with no
coroutine switch, which is most of a request's cost in Python. The replies answered in one turn
go out in one ``transport.write`` (one send, one TLS record, for a client that pipelines).

Counted from accept (``admission.py``): the server accepts plain TCP and starts TLS itself
(``tls_start.py``, with a handshake deadline), so a connection holds a pending slot from its
first byte, through its handshake and until ``hello``; only then does it take an admitted one.
Before that its frames are at most ``max_pre_auth_frame_bytes``, and the whole pending phase must
end within ``hello_timeout_s``.

Bounded and fair: at most ``max_in_flight`` requests of a connection wait (bumps, rolls, a lease
waiting for a block) at once, and at most ``FRAMES_PER_TURN`` frames are answered per event-loop
turn. Past either bound the connection stops parsing and stops reading from its socket
(backpressure onto the client's TCP window) until a request finishes or the next turn. A client
that does not read its replies stops being read too.

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
from pidfence.pid_allocator.protocol import LENGTH, Request, RequestId, encode_frame, error_reply
from pidfence.pid_allocator.settings import LeaseServerSettings
from pidfence.pid_allocator.tls_start import TlsStart

#: Frames answered per event-loop turn before yielding to other connections.
FRAMES_PER_TURN = 64


class ConnectionHost(Protocol):
    """What a connection needs from its server (``server.LeaseServer`` is one)."""

    settings: LeaseServerSettings
    tls: ssl.SSLContext | None

    @property
    def auth_required(self) -> bool:
        """Whether connections must ``hello`` first."""
        ...

    def accept(self, connection: LeaseConnection) -> str | None:
        """Count a new connection; None, or why it is refused."""
        ...

    def admit(self, connection: LeaseConnection) -> str | None:
        """Move it to the admitted pool; None, or why it is refused."""
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
        self._offset = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._handshake: TlsStart | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._turn_scheduled = False
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
        refused = self.server.admit(self)
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
        if self._buffer:
            self._turn()

    def data_received(self, data: bytes) -> None:
        """Buffer, then answer what the bounds allow now."""
        if self._closed:
            return
        self._last_activity = self.loop.time()
        if self._handshake is not None and self._handshake.running:
            # The handshake finished and the client's first request came with it, before
            # start_tls returned the TLS transport that replies must go to: answer it then.
            self._buffer += data
            return
        if self.pending and self.stage == STAGE_NEW:
            self.server.advance(self)
        self._buffer += data
        self._turn()

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
        self._schedule_turn()

    # -- frames ---------------------------------------------------------------------------------

    def _has_frame(self) -> bool:
        remaining = len(self._buffer) - self._offset
        if remaining < 4:
            return False
        length = int(LENGTH.unpack_from(self._buffer, self._offset)[0])
        return length > self.max_frame or remaining >= 4 + length

    def _turn(self) -> None:
        """Answer up to ``FRAMES_PER_TURN`` frames; leave the rest for later turns."""
        self._turn_scheduled = False
        if self._closed:
            return
        buffer = self._buffer
        offset = self._offset
        handle_now = self.server.handle_now
        max_in_flight = self.settings.max_in_flight
        replies: list[bytes] = []
        answered = 0
        while not self._writing_paused and len(self._tasks) < max_in_flight:
            if answered >= FRAMES_PER_TURN:
                self._schedule_turn()
                break
            if len(buffer) - offset < 4:
                break
            (length,) = LENGTH.unpack_from(buffer, offset)
            if length > self.max_frame:
                self._refuse_frame(length, replies)
                return
            end = offset + 4 + length
            if len(buffer) < end:
                break
            body = bytes(buffer[offset + 4 : end])
            offset = end
            answered += 1
            result = handle_now(self, body)
            if type(result) is bytes:
                replies.append(result)
                if self.close_after_reply:
                    self._flush(replies)
                    self.close()
                    return
            else:
                self._spawn(result)  # type: ignore[arg-type]
        if replies:
            self._flush(replies)
        if offset:
            del buffer[:offset]
        self._offset = 0
        if self._closed:
            return
        has_frame = self._has_frame()
        self._track_partial(has_frame)
        self._update_reading(has_frame)

    def _refuse_frame(self, length: int, replies: list[bytes]) -> None:
        where = "before hello" if self.pending else "per frame"
        error = FrameLimitExceeded(
            f"frame of {length} bytes exceeds the {self.max_frame}-byte limit {where}"
        )
        self.server.note(FRAME_LIMIT, self, str(error))
        replies.append(self.server.encode(self.server.error_reply(None, error)))
        self._flush(replies)
        self.close()

    def _flush(self, replies: list[bytes]) -> None:
        if not self._closed and self.transport is not None:
            self.transport.write(replies[0] if len(replies) == 1 else b"".join(replies))

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled and not self._closed:
            self._turn_scheduled = True
            self.loop.call_soon(self._turn)

    def _track_partial(self, has_frame: bool) -> None:
        if not self._buffer or has_frame:
            self._partial_since = None
        elif self._partial_since is None:
            self._partial_since = self._last_activity  # a new frame started: its clock starts
            if self._timer is not None:
                self._timer.cancel()
            self._arm_timer(self._next_check())

    def _update_reading(self, has_frame: bool | None = None) -> None:
        if self.transport is None or self._closed:
            return
        if has_frame is None:
            has_frame = self._has_frame()
        # Stop reading while anything parsed waits: the kernel buffers, then TCP pushes back.
        busy = (
            self._writing_paused
            or len(self._tasks) >= self.settings.max_in_flight
            or has_frame
            or len(self._buffer) > self.max_frame + 4
        )
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
        task = self.loop.create_task(self._answer(request))
        self._tasks.add(task)
        task.add_done_callback(self._answered)

    async def _answer(self, request: Request) -> None:
        self._write(await self.server.handle(self, request))

    def _answered(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.close()  # handle() never raises; if it did, this stream is not trustworthy
        self._schedule_turn()

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
