"""The asyncio TCP front of a lease server: authentication, limits and dispatch (DESIGN.md §5).

Connections (``connection.py``) hand each frame body to ``handle_now``, which answers whatever
needs no waiting (bad frames, pings, hello, leases from a held block) synchronously, as an encoded
frame; the rest (bumps, rolls, a lease waiting for a block claim) goes to ``handle`` as a task.
Every bad frame gets an error reply and never an exception.

The lease reply is the hot path: it is built as one dict literal and packed by one reused
msgpack ``Packer`` (the event loop is the only thread that encodes), and its metrics are plain
numbers (``metrics.py``).

With auth tokens, a connection's first request must be ``hello`` with a listed token; before
it only ``ping`` is answered (``now_ms`` alone) and anything else gets UNAUTHENTICATED, after
which the connection closes.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgpack

from pidfence.pid_allocator.connection import LeaseConnection
from pidfence.pid_allocator.errors import (
    LeaseError,
    LeaseServiceUnavailable,
    StaleGeneration,
    Unauthenticated,
)
from pidfence.pid_allocator.metrics import ServerMetrics
from pidfence.pid_allocator.protocol import (
    LENGTH,
    PROTOCOL_VERSION,
    BumpRequest,
    HelloRequest,
    LeaseRequest,
    PingRequest,
    Request,
    RequestId,
    RequestRejected,
    RollRequest,
    error_reply,
    ok_reply,
    parse_request,
)
from pidfence.pid_allocator.service import Grant, LeaseService

if TYPE_CHECKING:
    from pidfence.pid_allocator.settings import LeaseServerSettings

log = logging.getLogger(__name__)

_UNAUTHENTICATED = "say hello with a valid auth token first (the server runs with --auth-tokens)"


class LeaseServer:
    """Serves one ``LeaseService`` over TCP (optionally TLS).

    Args:
        service: the lease logic (its ``settings`` hold the connection limits too).
        metrics: where counters go.
        tokens: auth token -> client name; None serves without authentication.
        tls: server-side TLS context; None serves plain TCP.
    """

    def __init__(
        self,
        service: LeaseService,
        metrics: ServerMetrics | None = None,
        tokens: Mapping[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.service = service
        self.metrics = metrics or ServerMetrics()
        self.tokens = dict(tokens) if tokens is not None else None
        self.tls = tls
        self._server: asyncio.Server | None = None
        self._connections: set[LeaseConnection] = set()
        self._per_address: dict[str, int] = {}
        self._latency = self.metrics.latency
        self._lease_latency = self._latency["lease"]
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.metrics.service_counts = self._service_counts

    @property
    def settings(self) -> LeaseServerSettings:
        """The service's settings (limits included)."""
        return self.service.settings

    @property
    def auth_required(self) -> bool:
        """Whether connections must ``hello`` first."""
        return self.tokens is not None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Listen; return the bound (host, port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: LeaseConnection(self), host, port, backlog=512, ssl=self.tls
        )
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
        pending: set[asyncio.Task[None]] = set()
        for connection in list(self._connections):
            pending |= connection.pending_tasks()
            connection.close()
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def connection_count(self) -> int:
        """Open connections."""
        return len(self._connections)

    def register(self, connection: LeaseConnection) -> str | None:
        """Admit a new connection; None, or why it is refused."""
        if len(self._connections) >= self.settings.max_connections:
            self.metrics.refused.inc()
            return "connection limit reached; try another lease server"
        held = self._per_address.get(connection.address, 0)
        if held >= self.settings.max_connections_per_address:
            self.metrics.refused.inc()
            return (
                f"{held} connections from this address already; close idle ones "
                "(--max-connections-per-address)"
            )
        self._per_address[connection.address] = held + 1
        self._connections.add(connection)
        self.metrics.connections.inc()
        return None

    def unregister(self, connection: LeaseConnection) -> None:
        """A connection closed."""
        if connection in self._connections:
            self._connections.discard(connection)
            left = self._per_address[connection.address] - 1
            if left:
                self._per_address[connection.address] = left
            else:
                del self._per_address[connection.address]
            self.metrics.connections.dec()

    # -- dispatch -------------------------------------------------------------------------------

    def _client_name(self, token: str) -> str | None:
        assert self.tokens is not None  # noqa: S101 - only called with auth on
        found = None
        for known, name in self.tokens.items():
            # Every token is compared (constant time each): timing shows neither which one
            # matched nor how much of a wrong one did.
            if hmac.compare_digest(known.encode(), token.encode()):
                found = name
        return found

    def encode(self, reply: dict[str, Any]) -> bytes:
        """One reply as a length-prefixed frame (event loop thread only: the packer is reused)."""
        body: bytes = self._pack(reply)
        return LENGTH.pack(len(body)) + body

    def handle_now(self, connection: LeaseConnection, body: bytes) -> bytes | Request:
        """The reply frame when it needs no waiting, else the parsed request for :meth:`handle`.

        After an UNAUTHENTICATED reply the connection is marked to close once it is written.
        """
        started = time.perf_counter()
        try:
            request = parse_request(body)
        except RequestRejected as exc:
            if not connection.authenticated:
                connection.close_after_reply = True
                reply = self.error_reply(None, Unauthenticated(_UNAUTHENTICATED))
            else:
                reply = self.error_reply(exc.request_id, exc.error)
            self._latency["invalid"].observe(time.perf_counter() - started)
            return self.encode(reply)
        if type(request) is LeaseRequest and connection.authenticated:
            try:
                fields = self.service.lease_fields_now(connection.client)
            except LeaseError as exc:
                reply = self.error_reply(request.id, exc)
            else:
                if fields is None:
                    return request  # waits for a block claim
                pid, generation, expire_ms, secret, cert = fields
                self.metrics.leases_issued += 1
                reply = {
                    "v": PROTOCOL_VERSION,
                    "id": request.id,
                    "error": None,
                    "pid": pid,
                    "generation": generation,
                    "expire_ms": expire_ms,
                    "secret": secret,
                    "sequence": 0,
                }
                if cert is not None:
                    reply["cert"] = cert
            frame = self.encode(reply)
            self._lease_latency.observe(time.perf_counter() - started)
            return frame
        if isinstance(request, PingRequest):
            op = "ping"
            reply = self._ping_reply(request.id, full=connection.authenticated)
        elif isinstance(request, HelloRequest):
            op = "hello"
            reply = self._hello(connection, request)
        elif not connection.authenticated:
            op = "invalid"
            connection.close_after_reply = True
            reply = self.error_reply(request.id, Unauthenticated(_UNAUTHENTICATED))
        else:
            return request
        self._latency[op].observe(time.perf_counter() - started)
        return self.encode(reply)

    def _hello(self, connection: LeaseConnection, request: HelloRequest) -> dict[str, Any]:
        if self.tokens is None:
            return ok_reply(request.id, client=connection.client)
        name = self._client_name(request.token)
        if name is None:
            connection.close_after_reply = True
            return self.error_reply(request.id, Unauthenticated("unknown auth token"))
        connection.authenticate(name)
        return ok_reply(request.id, client=name)

    def _ping_reply(self, request_id: RequestId, *, full: bool) -> dict[str, Any]:
        if not full:
            return ok_reply(request_id, now_ms=self.service.clock())
        return ok_reply(
            request_id,
            server=self.service.server_id,
            now_ms=self.service.clock(),
            zookeeper="CONNECTED" if self.service.coordinator.connected else "DOWN",
            leases=len(self.service.ring),
        )

    async def handle(self, connection: LeaseConnection, request: Request) -> dict[str, Any]:
        """The reply to a request that may wait (never raises for bad input)."""
        started = time.perf_counter()
        op = "invalid"
        client = connection.client
        try:
            if isinstance(request, LeaseRequest):
                op = "lease"
                self.metrics.leases_waited += 1
                grant = await self.service.lease(request.partitions, client)
                self.metrics.leases_issued += 1
                reply = _grant_reply(request.id, grant, sequence=0)
            elif isinstance(request, BumpRequest):
                op = "bump"
                grant = await self.service.bump(
                    request.pid, request.generation, request.secret, request.token, client
                )
                self.metrics.bumps.inc()
                reply = _grant_reply(request.id, grant)
            elif isinstance(request, RollRequest):
                op = "roll"
                grant = await self.service.roll(
                    request.pid, request.generation, request.secret, request.token, client
                )
                self.metrics.rolls.inc()
                reply = _grant_reply(request.id, grant, sequence=0)
            else:
                raise TypeError(f"{type(request).__name__} is answered by handle_now")
        except LeaseError as exc:
            reply = self.error_reply(request.id, exc)
        except Exception as exc:  # a bug must not kill the server; the client may retry
            log.exception("request failed")
            reply = self.error_reply(
                request.id, LeaseServiceUnavailable(f"internal error ({type(exc).__name__})")
            )
        self._latency[op].observe(time.perf_counter() - started)
        return reply

    def error_reply(self, request_id: RequestId, error: Exception) -> dict[str, Any]:
        """An error reply, counted by code (a stale owner also learns the successor)."""
        code = getattr(error, "code", "MALFORMED_REQUEST")
        self.metrics.errors.labels(code).inc()
        reply = error_reply(request_id, code, str(error))
        if isinstance(error, StaleGeneration) and error.successor is not None:
            reply["successor"] = error.successor
            reply["successor_generation"] = error.successor_generation
        return reply

    def _service_counts(self) -> tuple[int, int, int]:
        """Blocks claimed, ZooKeeper writes and ZooKeeper errors, read when metrics are scraped."""
        coordinator = self.service.coordinator
        return (
            self.service.blocks_claimed,
            coordinator.writes,
            int(getattr(coordinator, "errors", 0)),
        )


def _grant_reply(request_id: RequestId, grant: Grant, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "pid": grant.pid,
        "generation": grant.generation,
        "expire_ms": grant.expire_ms,
        "secret": grant.secret,
    }
    if grant.cert is not None:
        fields["cert"] = grant.cert
    return ok_reply(request_id, **fields, **extra)
