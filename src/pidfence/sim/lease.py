"""The simulated lease servers: the product's own lease service, with only the world swapped.

:class:`SimLeaseServer` answers like :class:`pidfence.pid_allocator.LeaseClient` (``lease``,
``bump``, ``roll``, ``describe``, the same errors) by running the real
:class:`~pidfence.pid_allocator.LeaseService` (blocks, the lease ring, lineage, owner checks,
signing and record MAC keys) over the real in-memory coordinator
(:class:`~pidfence.pid_allocator.MemoryCoordinator`), on the simulation's fake clock. It keeps no
rule of its own (DESIGN §10 amended): a bug seeded into ``pid_allocator`` is a bug here. What it
adds is the world: outages during which no request arrives, and the calls made synchronously
(the service's ZooKeeper work runs inline, on one event loop per schedule).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.pid_allocator import (
    LeaseError,
    LeaseServerSettings,
    LeaseServerUnreachable,
    LeaseService,
    MemoryCoordinator,
)
from pidfence.pid_allocator.client import Lease
from pidfence.pid_allocator.service import Grant
from pidfence.wire import PidStatus

T = TypeVar("T")

#: What the lease server did, counted (``described``: the sinks' questions; ``confirmed``: the
#: producers' checkpoints asking whether they were replaced).
_COUNTS = ("rolls", "refused", "outages", "unanswered", "described", "confirmed")


class _InlineLoop(asyncio.SelectorEventLoop):
    """An event loop whose executor calls run inline: their result is an asyncio future that is
    done at once (no thread, no wake-up through the loop's self-pipe)."""

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        done: asyncio.Future[T] = self.create_future()
        try:
            done.set_result(func(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            done.set_exception(exc)
        return done


@dataclass(eq=False)
class SimLeaseServer:
    """The real lease service on a fake clock, reached through a network that may be down.

    Args:
        rng: the service's randomness (block salts, secrets, tokens): seeded, so a schedule
            replays exactly.
        lifetime_ms: lease lifetime; retired and ended pids stay known one more lifetime.
        signing_key: the key that signs every grant's ``cert`` (DESIGN §3 amended).
        outage_p: per :meth:`tick`, the lease servers become unreachable for up to a quarter of
            a lease lifetime (requests never arrive: ``LeaseServerUnreachable``, as
            ``LeaseClient`` raises after its retries).
        outage_rng: the outages' own randomness (so schedules without outages stay the same).
        mac_secret: the per-record MAC secret: every grant carries the lease's ``mac_key``.
        fresh_rollover: the mutation ``fresh_rollover``: ``roll`` leases an unrelated pid and
            retires nothing (the rollover before DESIGN §9), so tests can prove it is caught.
    """

    rng: random.Random
    lifetime_ms: int
    signing_key: Ed25519PrivateKey | None = None
    outage_p: float = 0.0
    outage_rng: random.Random = field(default_factory=lambda: random.Random(0))
    mac_secret: bytes | None = None
    fresh_rollover: bool = False
    now: int = field(default=0, init=False)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTS, 0), init=False)
    #: No lease server answers before this time.
    down_until: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.store = MemoryCoordinator()
        self.service = LeaseService(
            self.store,
            # Never called: _InlineLoop runs every executor call inline, in the caller's thread.
            Executor(),
            LeaseServerSettings(
                lifetime_ms=self.lifetime_ms, block_ttl_ms=self.lifetime_ms, capacity=4096
            ),
            server_id="sim-lease",
            clock=lambda: self.now,
            rng=self.rng,
            signing_key=self.signing_key,
            mac_secret=self.mac_secret,
        )
        self._loop = _InlineLoop()

    def close(self) -> None:
        """Close the event loop the service runs on."""
        self._loop.close()

    def tick(self, now: int) -> None:
        """Move the clock to ``now``; maybe start an outage.

        Outages last under a quarter of a lifetime and are a quarter of a lifetime apart, so a
        restart is delayed by less than that (crashed processes restart within the lineage
        retention, as docs/producer.md asks of their supervisors).
        """
        self.now = now
        rng, quarter = self.outage_rng, max(self.lifetime_ms // 4, 2)
        if self.outage_p and now >= self.down_until + quarter and rng.random() < self.outage_p:
            self.down_until = now + rng.randrange(1, quarter)
            self.counts["outages"] += 1

    @property
    def down(self) -> bool:
        """Whether no lease server answers now."""
        return self.now < self.down_until

    def _call(self, request: Coroutine[Any, Any, T]) -> T:
        if self.down:
            request.close()
            self.counts["unanswered"] += 1
            raise LeaseServerUnreachable("no lease server answered (simulated outage)")
        try:
            return self._loop.run_until_complete(request)
        except LeaseError:
            self.counts["refused"] += 1
            raise

    def lease(self, partitions: Any = (), *, key: bytes | None = None) -> Lease:
        """A new pid, never issued before."""
        return _lease(self._call(self.service.lease(tuple(partitions), "sim", key)))

    def bump(self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None) -> Lease:
        """The next generation of a live pid whose latest generation is ``generation``."""
        return _lease(self._call(self.service.bump(pid, generation, secret, None, "sim", key)))

    def roll(self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None) -> Lease:
        """Retire ``pid`` at ``generation`` and return its successor (compare-and-set)."""
        if self.fresh_rollover:
            return self.lease(key=key)
        successor = _lease(self._call(self.service.roll(pid, generation, secret, None, "sim", key)))
        self.counts["rolls"] += 1
        return successor

    def describe(self, pid: int) -> PidStatus:
        """What the lease authority knows of ``pid`` (the sinks' question)."""
        self.counts["described"] += 1
        return self._call(self.service.describe(pid, "sink"))


@dataclass(eq=False)
class ProducerLease:
    """The simulated lease servers as the producers reach them: the same service, with the
    producers' own ``describe`` (``checkpoint()`` asks whether this instance was replaced)
    counted apart from the sinks'."""

    server: SimLeaseServer

    def lease(self, partitions: Any = (), *, key: bytes | None = None) -> Lease:
        """A new pid (:meth:`SimLeaseServer.lease`)."""
        return self.server.lease(partitions, key=key)

    def bump(self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None) -> Lease:
        """:meth:`SimLeaseServer.bump`."""
        return self.server.bump(pid, generation, secret, key=key)

    def roll(self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None) -> Lease:
        """:meth:`SimLeaseServer.roll`."""
        return self.server.roll(pid, generation, secret, key=key)

    def describe(self, pid: int) -> PidStatus:
        """What the lease authority knows of ``pid`` (a producer's checkpoint asks)."""
        server = self.server
        server.counts["confirmed"] += 1
        return server._call(server.service.describe(pid, "sim"))


def _lease(grant: Grant) -> Lease:
    return Lease(
        grant.pid,
        grant.generation,
        0,
        grant.expire_ms,
        grant.secret,
        grant.cert,
        grant.mac_key,
        grant.prior_mac_key,
    )
