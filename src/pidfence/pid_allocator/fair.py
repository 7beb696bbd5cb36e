"""Each client's share of the event loop: frames are answered in turns, round-robin by client
(DESIGN.md §5 amended again, "Nobody slows anybody").

A client is the token's name after ``hello`` (the address before it, or without auth tokens), so its
connection count and pipeline depth buy it nothing: a connection holding a whole frame joins its
client's line and stops being read (TCP pushes back on the sender), and each turn answers one frame
of the next client in line. A client that has ``max_in_flight`` requests being answered (bumps,
rolls, describes, leases waiting for a block) leaves the line until one is answered. A request that
arrives while a client has nothing else outstanding is always served in its turn; one sent beside
others is charged to the client's rate bucket for its kind (bumps and rolls, or leases), and when
the bucket is empty it is refused RATE_LIMITED, before any ZooKeeper work, with the time until it
holds a token, and the client is not read again before then. So a client one request at a time
never sees RATE_LIMITED, and a flooder ignoring the retry-after costs the server nothing more.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

#: Frames answered per event-loop callback before the loop polls sockets again.
FRAMES_PER_TURN = 64
#: Rate buckets: bumps and rolls (each is ZooKeeper work), and leases.
BUMPS, LEASES = 0, 1
#: A whole token, give or take float rounding (0.1 s at 10/s refills 0.9999999999999999).
_ONE = 1 - 1e-9


class Served(Protocol):
    """What turns need of a connection (``connection.LeaseConnection`` is one)."""

    client: str
    queued: bool

    @property
    def closed(self) -> bool:
        """Whether it is closed (its queued turn is dropped)."""
        ...

    def serve_one(self) -> None:
        """Answer its next frame."""
        ...

    def has_frame(self) -> bool:
        """Whether a whole frame (or an oversized length) is buffered."""
        ...

    def drained(self) -> None:
        """It holds no whole frame any more: read again."""
        ...

    def flush(self) -> None:
        """Write the replies of its frames answered in this turn."""
        ...

    def abort(self) -> None:
        """Drop the connection now (serving it failed)."""
        ...


def _safely(connection: Served, action: Callable[[], None]) -> bool:
    """Run ``action`` of ``connection``; a failure (a bug) drops that connection only, so it
    can never stop the turns of everyone else. True when it ran."""
    try:
        action()
    except Exception:
        log.exception("serving a connection of %s failed; dropping it", connection.client)
        try:
            connection.abort()
        except Exception:  # dropped as far as it goes; the others come first
            log.exception("dropping a failed connection failed")
        return False
    return True


class Bucket:
    """A token bucket: ``rate`` tokens per second, at most ``burst`` held."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = self.burst
        self.stamp = now

    def _fill(self, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return self.tokens

    def take(self, now: float, *, force: bool = False) -> float:
        """Take a token: 0.0, or the seconds until one is there (nothing taken). ``force``
        takes one if there is one and never refuses."""
        if self._fill(now) >= _ONE:
            self.tokens = max(0.0, self.tokens - 1)
            return 0.0
        return 0.0 if force else (1 - self.tokens) / self.rate

    def full(self, now: float) -> bool:
        """Whether it holds its whole burst again (forgetting it changes nothing)."""
        return self.tokens + (now - self.stamp) * self.rate >= self.burst


class Client:
    """One client's line of connections, requests in flight, mute and rate buckets."""

    __slots__ = ("buckets", "in_flight", "in_ring", "muted_until", "name", "ready", "waking")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: deque[Served] = deque()
        self.in_flight = 0
        self.in_ring = False
        self.muted_until = 0.0
        self.waking = False
        self.buckets: list[Bucket | None] = [None, None]


class Turns:
    """Round-robin turns of clients holding a frame, their in-flight bound and rate buckets.

    Args:
        loop: the server's event loop.
        max_in_flight: requests of one client being answered at once.
        rates: (rate per second, burst) of bumps and of leases; a rate of 0 is no limit.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        max_in_flight: int,
        rates: tuple[tuple[float, int], tuple[float, int]],
    ) -> None:
        self.loop = loop
        self.max_in_flight = max_in_flight
        self.rates = rates
        self.clients: dict[str, Client] = {}
        self._ring: deque[Client] = deque()
        self._scheduled = False
        self._sweep_at = 256

    def key(self, connection: Served) -> str:
        """Whose share a connection's frames and requests count against: its client's."""
        return connection.client

    def ready(self, connection: Served) -> None:
        """``connection`` holds a whole frame: answer it now if nobody waits, else queue it in
        its client's line."""
        name = self.key(connection)
        client = self.clients.get(name) or self._new(name)
        if self._scheduled or self._ring or client.ready or not self._may_serve(client):
            self._enter(self._line(connection, client))
            return
        # Nobody waits: answered now, no turn to schedule.
        if not _safely(connection, connection.serve_one):
            return
        if not connection.closed and connection.has_frame():
            self._enter(self._line(connection))
        _safely(connection, connection.flush)

    def _line(self, connection: Served, client: Client | None = None) -> Client:
        """Queue ``connection`` in its client's line."""
        if client is None:
            name = self.key(connection)
            client = self.clients.get(name) or self._new(name)
        connection.queued = True
        client.ready.append(connection)
        return client

    def started(self, name: str) -> None:
        """A request of client ``name`` (:meth:`key`) is being answered (a task)."""
        self.clients[name].in_flight += 1

    def finished(self, name: str) -> None:
        """A request of client ``name`` was answered (or cancelled)."""
        client = self.clients[name]
        client.in_flight -= 1
        if client.ready:
            self._enter(client)

    def charge(self, connection: Served, kind: int) -> float:
        """Charge a request of ``kind`` to its client: 0.0, or the seconds to wait (refused: the
        client is not read before then)."""
        client = self.clients[self.key(connection)]
        bucket = client.buckets[kind]
        if bucket is None:
            rate, burst = self.rates[kind]
            if rate <= 0:
                return 0.0
            bucket = client.buckets[kind] = Bucket(rate, burst, self.loop.time())
        now = self.loop.time()
        alone = not (client.in_flight or client.ready or connection.has_frame())
        wait = bucket.take(now, force=alone)
        if wait:
            client.muted_until = now + wait
        return wait

    def _new(self, name: str) -> Client:
        if len(self.clients) >= self._sweep_at:
            self._forget_idle()
        client = self.clients[name] = Client(name)
        return client

    def _forget_idle(self) -> None:
        now = self.loop.time()
        for name, c in list(self.clients.items()):
            idle = not (c.ready or c.in_flight or c.waking or c.muted_until > now)
            if idle and all(b is None or b.full(now) for b in c.buckets):
                del self.clients[name]
        self._sweep_at = max(256, 2 * len(self.clients))

    def _may_serve(self, client: Client) -> bool:
        """Whether ``client`` is under its in-flight bound and not muted (else it is woken when
        its mute ends)."""
        if client.in_flight >= self.max_in_flight:
            return False
        if client.muted_until:
            wait = client.muted_until - self.loop.time()
            if wait > 0:
                if not client.waking:
                    client.waking = True
                    self.loop.call_later(wait, self._wake, client)
                return False
            client.muted_until = 0.0
        return True

    def _enter(self, client: Client) -> None:
        """Put ``client`` in line if it may be served now (else when it may)."""
        if client.in_ring or not self._may_serve(client):
            return
        client.in_ring = True
        self._ring.append(client)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._turn)

    def _serve(self, client: Client) -> Served:
        """Answer one frame of ``client``'s first connection in line; queue it again behind the
        client's others if it holds another."""
        connection = client.ready.popleft()
        connection.queued = False
        if not connection.closed and _safely(connection, connection.serve_one):
            if connection.closed:
                pass
            elif connection.has_frame():
                self._enter(self._line(connection))  # its client may have changed (hello)
            else:
                connection.drained()
        if client.ready:
            self._enter(client)
        return connection

    def _wake(self, client: Client) -> None:
        client.waking = False
        if client.ready:
            self._enter(client)

    def _turn(self) -> None:
        """Answer up to ``FRAMES_PER_TURN`` frames, one per client in turn (``_scheduled`` stays
        set meanwhile: clients entering the line wait for the next turn scheduled below, which
        is scheduled whatever happened in this one)."""
        ring = self._ring
        served: dict[Served, None] = {}
        try:
            for _ in range(FRAMES_PER_TURN):
                if not ring:
                    break
                client = ring.popleft()
                client.in_ring = False
                served[self._serve(client)] = None
            for connection in served:
                _safely(connection, connection.flush)
        finally:
            self._scheduled = bool(ring)
            if ring:
                self.loop.call_soon(self._turn)
