"""The asyncio TCP front of a lease server: admission, authentication, limits and dispatch
(DESIGN.md §5 and its amendments).

Connections (``connection.py``) hand each frame body to ``handle_now`` in their client's turn
(``fair.py``), which answers whatever needs no waiting (bad frames, pings, hello, leases from a held
block, requests over the client's rate) synchronously, as an encoded frame; the rest (bumps, rolls,
describes, a lease waiting for a block claim) goes to ``handle`` as a task. Every bad frame gets an
error reply and never an exception; a frame that breaks a decode limit gets MALFORMED_REQUEST and
its connection is closed.

The lease reply is the hot path: it is built as one dict literal and packed by one reused
msgpack ``Packer`` (the event loop is the only thread that encodes), and its metrics are plain
numbers (``metrics.py``).

With auth tokens, a connection's first request must be ``hello`` with a listed token; before
it only a ``ping`` of exactly ``{v, op, id}`` is answered (``now_ms`` alone) and anything else
gets UNAUTHENTICATED, after which the connection closes. Refusals are audited (``audit.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import ssl
import time
from collections.abc import Mapping
from typing import Any

import msgpack

from pidfence.pid_allocator.admission import Admission
from pidfence.pid_allocator.audit import (
    EVICTED,
    FRAME_LIMIT,
    HELLO_FAILED,
    NOT_OWNER,
    RATE_LIMITED,
    REFUSED,
    UNAUTHENTICATED,
    AuditTrail,
)
from pidfence.pid_allocator.connection import LeaseConnection
from pidfence.pid_allocator.errors import (
    FrameLimitExceeded,
    LeaseError,
    LeaseServiceUnavailable,
    NotOwner,
    RateLimited,
    StaleGeneration,
    Unauthenticated,
)
from pidfence.pid_allocator.fair import BUMPS, LEASES, Turns
from pidfence.pid_allocator.metrics import ServerMetrics, client_label
from pidfence.pid_allocator.protocol import (
    LENGTH,
    PROTOCOL_VERSION,
    BumpRequest,
    DescribeRequest,
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
from pidfence.pid_allocator.settings import LeaseServerSettings

log = logging.getLogger(__name__)

#: The rate bucket each request charges (other requests charge none).
# describe (the sinks' read-only question, issue 35) shares the lease bucket: no ZooKeeper write.
_CHARGED: dict[type, int] = {
    LeaseRequest: LEASES,
    DescribeRequest: LEASES,
    BumpRequest: BUMPS,
    RollRequest: BUMPS,
}
#: What each bucket counts, and its settings (named in RATE_LIMITED messages).
_RATES = {
    BUMPS: "bumps and rolls than its rate allows (--bump-rate, --bump-burst)",
    LEASES: "leases and describes than its rate allows (--lease-rate, --lease-burst)",
}
_UNAUTHENTICATED = (
    "say hello with a valid auth token first (the server runs with --auth-tokens): give the "
    "client its token file ($PIDFENCE_LEASE_TOKEN_FILE, or LeaseClient(token=load_token_file(F)))"
)


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
        self.settings: LeaseServerSettings = service.settings
        self.metrics = metrics or ServerMetrics()
        self.tokens = dict(tokens) if tokens is not None else None
        self.tls = tls
        self.audit = AuditTrail(self.metrics, self.settings.audit_interval_s)
        self.admission = Admission(
            self.settings.max_connections,
            self.settings.pending_cap,
            self.settings.max_connections_per_address,
            self.settings.client_connection_cap,
        )
        self._server: asyncio.Server | None = None
        self._connections: set[LeaseConnection] = set()
        self._latency = self.metrics.latency
        self._lease_latency = self._latency["lease"]
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.metrics.service_counts = self._service_counts
        ring, clock = self.service.ring, self.service.clock
        self.metrics.ring_counts = lambda: (ring.live(clock()), ring.capacity)
        s = self.settings
        rates = ((s.bump_rate, s.bump_burst), (s.lease_rate, s.lease_burst))
        self.turns = Turns(asyncio.get_running_loop(), s.max_in_flight, rates)
        #: Requests charged to a rate bucket (none when that rate is off).
        self._charged = {t: kind for t, kind in _CHARGED.items() if rates[kind][0] > 0}
        self.metrics.client_queues = self._client_queues

    @property
    def auth_required(self) -> bool:
        """Whether connections must ``hello`` first."""
        return self.tokens is not None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Listen (plain TCP: TLS starts per connection, counted from accept); return the bound
        (host, port)."""
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
        pending: set[asyncio.Task[None]] = set()
        for connection in list(self._connections):
            pending |= connection.pending_tasks()
            if connection.pending:
                connection.abort()
            else:
                connection.close()
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # -- admission (connection.ConnectionHost) ---------------------------------------------------

    def accept(self, connection: LeaseConnection) -> str | None:
        """Count a new connection as pending, evicting the least advanced pending ones to make
        room (never refused: the pending pool makes room)."""
        for victim in self.admission.accept(connection):
            self.metrics.evicted.inc()
            assert isinstance(victim, LeaseConnection)  # noqa: S101 - only connections are slots
            self.note(EVICTED, victim, "a newer connection needed its pending slot")
            victim.abort()
        self._connections.add(connection)
        self.metrics.pending.set(self.admission.pending)
        return None

    def admit(self, connection: LeaseConnection, client: str | None = None) -> str | None:
        """Move a pending connection to the admitted pool (as ``client``'s, after ``hello``)."""
        refused = self.admission.admit(connection, client)
        if refused is not None:
            self.metrics.refused.inc()
            self.note(REFUSED, connection, refused)
        self._gauges()
        return refused

    def advance(self, connection: LeaseConnection) -> None:
        """A pending connection made progress (TLS done, or its first bytes)."""
        self.admission.advance(connection)

    def release(self, connection: LeaseConnection) -> None:
        """A connection closed."""
        self._connections.discard(connection)
        self.admission.release(connection)
        self._gauges()

    def _gauges(self) -> None:
        self.metrics.connections.set(self.admission.admitted)
        self.metrics.pending.set(self.admission.pending)

    def note(self, event: str, connection: LeaseConnection, detail: str = "") -> None:
        """Audit a refusal of ``connection``'s peer."""
        self.audit.note(event, connection.address, detail)

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

        After an UNAUTHENTICATED reply or a broken decode limit the connection is marked to
        close once the reply is written.
        """
        started = time.perf_counter()
        try:
            request = parse_request(body, pre_auth=connection.pending)
        except RequestRejected as exc:
            reply = self._rejected(connection, exc)
            self._latency["invalid"].observe(time.perf_counter() - started)
            return self.encode(reply)
        if connection.authenticated:
            kind = self._charged.get(type(request))
            if kind is not None:
                wait = self.turns.charge(connection, kind)
                if wait:
                    return self._rate_limited(connection, request.id, kind, wait, started)
            if type(request) is LeaseRequest:
                return self._lease_now(connection, request, started)
        if isinstance(request, PingRequest):
            op = "ping"
            reply = self._ping_reply(request.id, full=connection.authenticated)
        elif isinstance(request, HelloRequest):
            op = "hello"
            reply = self._hello(connection, request)
        elif not connection.authenticated:
            op = "invalid"
            connection.close_after_reply = True
            self.note(UNAUTHENTICATED, connection, f"{type(request).__name__} before hello")
            reply = self.error_reply(request.id, Unauthenticated(_UNAUTHENTICATED))
        else:
            return request
        self._latency[op].observe(time.perf_counter() - started)
        return self.encode(reply)

    def _rate_limited(
        self,
        connection: LeaseConnection,
        request_id: RequestId,
        kind: int,
        wait: float,
        started: float,
    ) -> bytes:
        retry_ms = max(1, math.ceil(wait * 1000))
        error = RateLimited(
            f"this client sends more {_RATES[kind]} beside its other requests; retry after "
            f"{retry_ms} ms",
            retry_ms,
        )
        self.refused(connection)
        frame = self.encode(self.error_reply(request_id, error))
        self._latency["invalid"].observe(time.perf_counter() - started)
        return frame

    def refused(self, connection: LeaseConnection) -> None:
        """Audit a RATE_LIMITED answer and count it for the client."""
        self.note(RATE_LIMITED, connection)
        label = client_label(connection.client)
        refusals = self.metrics.client_refusals
        refusals[label] = refusals.get(label, 0) + 1

    def _client_queues(self) -> list[tuple[str, int, int]]:
        """(label, requests in flight, connections waiting) per client, read at scrape time."""
        return [
            (client_label(c.name), c.in_flight, len(c.ready))
            for c in list(self.turns.clients.values())
        ]

    def _rejected(self, connection: LeaseConnection, exc: RequestRejected) -> dict[str, Any]:
        if isinstance(exc.error, FrameLimitExceeded):
            connection.close_after_reply = True
            self.note(FRAME_LIMIT, connection, str(exc.error))
            return self.error_reply(exc.request_id, exc.error)
        if not connection.authenticated:
            connection.close_after_reply = True
            self.note(UNAUTHENTICATED, connection, "undecodable frame before hello")
            return self.error_reply(None, Unauthenticated(_UNAUTHENTICATED))
        return self.error_reply(exc.request_id, exc.error)

    def _lease_now(
        self, connection: LeaseConnection, request: LeaseRequest, started: float
    ) -> bytes | LeaseRequest:
        try:
            fields = self.service.lease_fields_now(connection.client, request.key)
        except LeaseError as exc:
            reply = self.error_reply(request.id, exc)
        else:
            if fields is None:
                return request  # waits for a block claim
            pid, generation, expire_ms, secret, cert, mac_key = fields
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
            if mac_key is not None:
                reply["mac_key"] = mac_key
        frame = self.encode(reply)
        self._lease_latency.observe(time.perf_counter() - started)
        return frame

    def _hello(self, connection: LeaseConnection, request: HelloRequest) -> dict[str, Any]:
        if self.tokens is None:
            return ok_reply(request.id, client=connection.client)
        name = self._client_name(request.token)
        if name is None:
            connection.close_after_reply = True
            self.note(HELLO_FAILED, connection, "unknown auth token")
            return self.error_reply(request.id, Unauthenticated("unknown auth token"))
        refused = connection.admit_as(name)
        if refused is not None:
            connection.close_after_reply = True
            return self.error_reply(request.id, LeaseServiceUnavailable(refused))
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
            lifetime_ms=self.service.settings.lifetime_ms,
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
                grant = await self.service.lease(request.partitions, client, request.key)
                self.metrics.leases_issued += 1
                reply = _grant_reply(request.id, grant, sequence=0)
            elif isinstance(request, BumpRequest | RollRequest):
                roll = isinstance(request, RollRequest)
                op = "roll" if roll else "bump"
                change = self.service.roll if roll else self.service.bump
                grant = await change(
                    request.pid,
                    request.generation,
                    request.secret,
                    request.token,
                    client,
                    request.key,
                )
                (self.metrics.rolls if roll else self.metrics.bumps).inc()
                reply = _grant_reply(request.id, grant, **({"sequence": 0} if roll else {}))
            elif isinstance(request, DescribeRequest):
                op = "describe"
                status = await self.service.describe(request.pid, client)
                reply = ok_reply(
                    request.id,
                    pid=status.pid,
                    state=status.state.value,
                    generation=status.generation,
                    expire_ms=status.expire_ms,
                )
            else:
                raise TypeError(f"{type(request).__name__} is answered by handle_now")
        except LeaseError as exc:
            if isinstance(exc, NotOwner):
                self.note(NOT_OWNER, connection)
            elif isinstance(exc, RateLimited):
                self.refused(connection)
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
        if isinstance(error, RateLimited):
            reply["retry_after_ms"] = error.retry_after_ms
        elif isinstance(error, StaleGeneration) and error.successor is not None:
            reply["successor"] = error.successor
            reply["successor_generation"] = error.successor_generation
        return reply

    def _service_counts(self) -> tuple[int, int, int]:
        """Blocks claimed, ZooKeeper writes and ZooKeeper errors, read when metrics are scraped."""
        coordinator = self.service.coordinator
        return (
            self.service.supply.blocks_claimed,
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
    if grant.mac_key is not None:
        fields["mac_key"] = grant.mac_key
    if grant.prior_mac_key is not None:
        fields["prior_mac_key"] = grant.prior_mac_key
    return ok_reply(request_id, **fields, **extra)
