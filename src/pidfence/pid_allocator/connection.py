"""One client connection of a lease server, as an asyncio protocol.

A protocol (not streams) because a lease is answered straight from ``data_received`` with no
coroutine switch, which is most of a request's cost in Python. Requests that must wait (bumps,
a lease while a block claim is in flight) run as tasks; at most ``max_in_flight`` of them, after
which reading pauses. A connection idle for ``idle_timeout_s`` or holding a partial frame for
``frame_timeout_s`` is closed; a frame over 1 MiB gets MALFORMED_REQUEST, then the connection is
closed because the stream cannot be resynchronised.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pidfence.pid_allocator.errors import LeaseServiceUnavailable, MalformedRequest
from pidfence.pid_allocator.protocol import LENGTH, MAX_FRAME_BYTES, encode_frame, error_reply

if TYPE_CHECKING:
    from pidfence.pid_allocator.server import LeaseServer


class LeaseConnection(asyncio.Protocol):
    """Frames in, replies out, for one client."""

    def __init__(self, server: LeaseServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading_paused = False
        self._writing_paused = False
        self._last_activity = self.loop.time()
        self._partial_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    # -- asyncio callbacks ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Register, or refuse with a retriable error when the server is full."""
        assert isinstance(transport, asyncio.Transport)  # noqa: S101 - TCP only
        self.transport = transport
        if not self.server.register(self):
            transport.write(
                encode_frame(
                    error_reply(
                        None,
                        LeaseServiceUnavailable.code,
                        "connection limit reached; try another lease server",
                    )
                )
            )
            self._closed = True
            transport.close()
            return
        self._arm_timer(self.server.limits.idle_timeout_s)

    def data_received(self, data: bytes) -> None:
        """Parse every complete frame; answer what can be answered now."""
        if self._closed:
            return
        self._last_activity = self.loop.time()
        buffer = self._buffer
        buffer += data
        offset = 0
        while len(buffer) - offset >= 4:
            (length,) = LENGTH.unpack_from(buffer, offset)
            if length > MAX_FRAME_BYTES:
                error = MalformedRequest(
                    f"frame of {length} bytes exceeds the {MAX_FRAME_BYTES} limit"
                )
                self._write(self.server.error_reply(None, error))
                self.close()
                return
            end = offset + 4 + length
            if len(buffer) < end:
                break
            body = bytes(buffer[offset + 4 : end])
            offset = end
            reply = self.server.handle_now(body)
            if reply is not None:
                self._write(reply)
            else:
                self._spawn(body)
        if offset:
            del buffer[:offset]
        if not buffer:
            self._partial_since = None
        elif self._partial_since is None or offset:
            self._partial_since = self._last_activity  # a new frame started: its clock starts
            if self._timer is not None:
                self._timer.cancel()
            self._arm_timer(self.server.limits.frame_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection and cancel its waiting requests."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for task in self._tasks:
            task.cancel()
        self.server.unregister(self)

    def pause_writing(self) -> None:
        """The client is not reading its replies: stop reading its requests."""
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        """The client caught up."""
        self._writing_paused = False
        self._update_reading()

    # -- internals ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the transport (replies already written are flushed first)."""
        if not self._closed and self.transport is not None:
            self._closed = True
            self.transport.close()

    def _write(self, reply: dict[str, Any]) -> None:
        if not self._closed and self.transport is not None:
            self.transport.write(encode_frame(reply))

    def _spawn(self, body: bytes) -> None:
        task = self.loop.create_task(self._answer(body))
        self._tasks.add(task)
        self._update_reading()

    async def _answer(self, body: bytes) -> None:
        try:
            self._write(await self.server.handle(body))
        finally:
            self._tasks.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]
            self._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None or self._closed:
            return
        busy = len(self._tasks) >= self.server.limits.max_in_flight or self._writing_paused
        if busy and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
        elif not busy and self._reading_paused:
            self.transport.resume_reading()
            self._reading_paused = False

    def _arm_timer(self, delay: float) -> None:
        self._timer = self.loop.call_later(max(delay, 0.01), self._check_timeouts)

    def _check_timeouts(self) -> None:
        if self._closed:
            return
        now = self.loop.time()
        limits = self.server.limits
        if self._partial_since is not None and now - self._partial_since >= limits.frame_timeout_s:
            self.close()  # a frame started and never finished: a slow or broken sender
            return
        if not self._tasks and now - self._last_activity >= limits.idle_timeout_s:
            self.close()
            return
        next_check = limits.idle_timeout_s - (now - self._last_activity)
        if self._partial_since is not None:
            next_check = min(next_check, limits.frame_timeout_s - (now - self._partial_since))
        self._arm_timer(next_check if next_check > 0 else limits.idle_timeout_s)
