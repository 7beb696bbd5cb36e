"""The asyncio TCP front of a lease server: limits and dispatch (DESIGN.md §5).

Connections (``connection.py``) hand each frame body to ``handle_now``, which answers whatever
needs no waiting (bad frames, pings, leases from a held block) synchronously; the rest goes to
``handle`` as a task. Every bad frame gets an error reply and never an exception.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from pidfence.pid_allocator.connection import LeaseConnection
from pidfence.pid_allocator.errors import LeaseError, LeaseServiceUnavailable
from pidfence.pid_allocator.metrics import ServerMetrics
from pidfence.pid_allocator.protocol import (
    BumpRequest,
    LeaseRequest,
    PingRequest,
    RequestId,
    RequestRejected,
    error_reply,
    ok_reply,
    parse_request,
)
from pidfence.pid_allocator.service import Grant, LeaseService

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Per-server protection against slow or abusive clients."""

    max_connections: int = 1024
    max_in_flight: int = 32
    idle_timeout_s: float = 300.0
    frame_timeout_s: float = 10.0


class LeaseServer:
    """Serves one ``LeaseService`` over TCP.

    Args:
        service: the lease logic.
        metrics: where counters go.
        limits: connection limits.
    """

    def __init__(
        self,
        service: LeaseService,
        metrics: ServerMetrics | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.service = service
        self.metrics = metrics or ServerMetrics()
        self.limits = limits or ServerLimits()
        self._server: asyncio.Server | None = None
        self._connections: set[LeaseConnection] = set()
        self._zk_errors_seen = 0
        self._blocks_seen = 0
        self._zk_writes_seen = 0
        self._latency = {
            op: self.metrics.latency.labels(op) for op in ("lease", "bump", "ping", "invalid")
        }

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Listen; return the bound (host, port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: LeaseConnection(self), host, port, backlog=512
        )
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def connection_count(self) -> int:
        """Open connections."""
        return len(self._connections)

    def register(self, connection: LeaseConnection) -> bool:
        """Admit a new connection unless ``max_connections`` are open."""
        if len(self._connections) >= self.limits.max_connections:
            self.metrics.refused.inc()
            return False
        self._connections.add(connection)
        self.metrics.connections.inc()
        return True

    def unregister(self, connection: LeaseConnection) -> None:
        """A connection closed."""
        if connection in self._connections:
            self._connections.discard(connection)
            self.metrics.connections.dec()

    def handle_now(self, body: bytes) -> dict[str, Any] | None:
        """The reply when it needs no waiting (bad frames, pings, leases from a held block).

        None means: answer with ``handle`` (a bump, or a lease that waits for a block claim).
        """
        started = time.perf_counter()
        try:
            request = parse_request(body)
        except RequestRejected as exc:
            reply = self.error_reply(exc.request_id, exc.error)
            op = "invalid"
        else:
            if isinstance(request, BumpRequest):
                return None
            op = "ping" if isinstance(request, PingRequest) else "lease"
            try:
                if isinstance(request, PingRequest):
                    reply = self._ping_reply(request.id)
                else:
                    grant = self.service.lease_now()
                    if grant is None:
                        return None
                    self.metrics.leases.inc()
                    reply = _grant_reply(request.id, grant, sequence=0)
            except LeaseError as exc:
                reply = self.error_reply(request.id, exc)
        self._sync_counters()
        self._latency[op].observe(time.perf_counter() - started)
        return reply

    def _ping_reply(self, request_id: RequestId) -> dict[str, Any]:
        return ok_reply(
            request_id,
            server=self.service.server_id,
            now_ms=self.service.clock(),
            zookeeper="CONNECTED" if self.service.coordinator.connected else "DOWN",
            leases=len(self.service.ring),
        )

    async def handle(self, body: bytes) -> dict[str, Any]:
        """The reply map for one request frame body (never raises for bad input)."""
        started = time.perf_counter()
        request_id: RequestId = None
        op = "invalid"
        try:
            request = parse_request(body)
            request_id = request.id
            if isinstance(request, LeaseRequest):
                op = "lease"
                grant = await self.service.lease(request.partitions)
                self.metrics.leases.inc()
                reply = _grant_reply(request_id, grant, sequence=0)
            elif isinstance(request, BumpRequest):
                op = "bump"
                grant = await self.service.bump(request.pid, request.generation, request.token)
                self.metrics.bumps.inc()
                reply = _grant_reply(request_id, grant)
            else:
                op = "ping"
                reply = self._ping_reply(request_id)
        except RequestRejected as exc:
            reply = self.error_reply(exc.request_id, exc.error)
        except LeaseError as exc:
            reply = self.error_reply(request_id, exc)
        except Exception as exc:  # a bug must not kill the server; the client may retry
            log.exception("request failed")
            reply = self.error_reply(
                request_id, LeaseServiceUnavailable(f"internal error ({type(exc).__name__})")
            )
        self._sync_counters()
        self._latency[op].observe(time.perf_counter() - started)
        return reply

    def error_reply(self, request_id: RequestId, error: Exception) -> dict[str, Any]:
        """An error reply, counted by code."""
        code = getattr(error, "code", "MALFORMED_REQUEST")
        self.metrics.errors.labels(code).inc()
        return error_reply(request_id, code, str(error))

    def _sync_counters(self) -> None:
        blocks = self.service.blocks_claimed
        if blocks > self._blocks_seen:
            self.metrics.blocks.inc(blocks - self._blocks_seen)
            self._blocks_seen = blocks
        writes = self.service.coordinator.writes
        if writes > self._zk_writes_seen:
            self.metrics.zk_writes.inc(writes - self._zk_writes_seen)
            self._zk_writes_seen = writes
        errors = int(getattr(self.service.coordinator, "errors", 0))
        if errors > self._zk_errors_seen:
            self.metrics.zk_errors.inc(errors - self._zk_errors_seen)
            self._zk_errors_seen = errors


def _grant_reply(request_id: RequestId, grant: Grant, **extra: Any) -> dict[str, Any]:
    return ok_reply(
        request_id, pid=grant.pid, generation=grant.generation, expire_ms=grant.expire_ms, **extra
    )
