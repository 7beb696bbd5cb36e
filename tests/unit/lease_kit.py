"""Shared by the lease-service unit tests: lease services on one in-memory store and one manual
clock (the servers of one cluster), and async tests without a plugin."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec

from pidfence.pid_allocator import LeaseServerSettings, LeaseService, MemoryCoordinator
from pidfence.testing import ManualClock

P = ParamSpec("P")


def asynchronous(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an ``async def`` test in a fresh event loop (its fixtures stay as they are)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


@dataclass
class LeaseServers:
    """Lease services that share one store and one clock, as the servers of one cluster do.

    Attributes:
        executor: the services' thread pool for store calls.
        store: the in-memory coordinator (its fault hooks are the tests' faults).
        clock: epoch milliseconds, moved by the test.
    """

    executor: ThreadPoolExecutor
    store: MemoryCoordinator = field(default_factory=MemoryCoordinator)
    clock: ManualClock[int] = field(default_factory=lambda: ManualClock(1_000_000))

    def service(self, seed: int | None = None, **settings: Any) -> LeaseService:
        """A new server: blocks of 10 pids and 1 s leases unless ``settings`` say otherwise.

        Without ``seed`` each gets its own random source: equal seeds would give equal
        idempotency tokens.
        """
        config = LeaseServerSettings(**{"block_size": 10, "lifetime_ms": 1000, **settings})
        rng = random.Random() if seed is None else random.Random(seed)
        return LeaseService(self.store, self.executor, config, clock=self.clock, rng=rng)
