"""A fair, bounded queue in front of ZooKeeper: a flooder delays itself only (DESIGN.md §5
amended again).

Every request that needs ZooKeeper (bumps, rolls, describes, and owner checks the server cannot
answer locally) goes through :class:`ZkQueue`. Each client (token name, or address without auth) has
a bucket of its own; workers take one job from each non-empty bucket in turn (round-robin), and at
most ``workers`` jobs run at once, so the executor never holds a first-come queue of its own. A
client waits behind at most one job of every other client, however many those have queued; and
``reserve`` more jobs may run for clients with nothing running, so a client one request at a
time does not even wait for a flooder's ZooKeeper call to end before its own starts.

Bounds: one client at most ``share`` jobs queued or running (more: ``RATE_LIMITED`` for it); all
clients together at most ``limit``. When the whole queue is full, a job of a client holding less
than the busiest one pushes out the busiest client's newest waiting job (which gets
``RATE_LIMITED``) instead of being refused: a client inside its own quota is never refused
because others flood. Block claims do not queue here: they have their own executor.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pidfence.pid_allocator.errors import RateLimited

T = TypeVar("T")


@dataclass(slots=True)
class _Job:
    client: str
    fn: Callable[..., Any]
    args: tuple[object, ...]
    waiter: asyncio.Future[Any]


@dataclass(slots=True)
class _Bucket:
    waiting: deque[_Job] = field(default_factory=deque)
    running: int = 0

    @property
    def held(self) -> int:
        return len(self.waiting) + self.running


class ZkQueue:
    """Runs blocking coordinator calls on ``executor``, round-robin across clients, bounded.

    Args:
        executor: where the calls run.
        limit: jobs queued or running at most, all clients together.
        share: jobs one client may have queued or running at most.
        workers: jobs running at once at most.
        reserve: jobs that may run beyond ``workers`` for clients with none running (the
            executor has ``workers + reserve`` threads).
    """

    def __init__(
        self, executor: Executor, limit: int, share: int, workers: int = 4, reserve: int = 1
    ) -> None:
        self._executor = executor
        self.limit = limit
        self.share = share
        self.workers = max(1, workers)
        self.reserve = reserve
        self._buckets: dict[str, _Bucket] = {}
        self._turns: deque[str] = deque()  # clients with waiting jobs, in round-robin order
        self._pending = 0
        self._running = 0
        self.refused = 0

    @property
    def pending(self) -> int:
        """Jobs queued or running now."""
        return self._pending

    def held_by(self, client: str) -> int:
        """Jobs of ``client`` queued or running now."""
        bucket = self._buckets.get(client)
        return 0 if bucket is None else bucket.held

    async def run(self, client: str, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the executor, in ``client``'s turn.

        Raises:
            RateLimited: this client holds its share, or the queue is full of jobs of clients
                holding no more than it does.
        """
        bucket = self._buckets.get(client)
        held = 0 if bucket is None else bucket.held
        if held >= self.share:
            self.refused += 1
            raise RateLimited(
                "lease server busy: this client has too many ZooKeeper requests queued; retry "
                "after a short pause"
            )
        if self._pending >= self.limit and not self._push_out(held):
            self.refused += 1
            raise RateLimited(
                "lease server busy: too many ZooKeeper requests queued; retry after a short pause"
            )
        if bucket is None:
            bucket = self._buckets[client] = _Bucket()
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if not bucket.waiting:
            self._turns.append(client)
        bucket.waiting.append(_Job(client, fn, args, waiter))
        self._pending += 1
        self._dispatch()
        return await waiter

    def _push_out(self, held: int) -> bool:
        """Refuse the newest waiting job of the busiest client if it holds more than ``held + 1``
        (more than the newcomer will hold with its job); whether one was refused."""
        busiest = max(
            (c for c, b in self._buckets.items() if b.waiting),
            key=lambda c: self._buckets[c].held,
            default=None,
        )
        if busiest is None or self._buckets[busiest].held <= held + 1:
            return False
        bucket = self._buckets[busiest]
        job = bucket.waiting.pop()
        self._pending -= 1
        if not bucket.waiting:
            self._turns.remove(busiest)
            self._forget_if_idle(busiest)
        if not job.waiter.done():
            job.waiter.set_exception(
                RateLimited(
                    "lease server busy: this client's ZooKeeper requests made room for others; "
                    "retry after a short pause"
                )
            )
        return True

    def _next(self) -> str | None:
        """The client whose job runs next (None: none may run now)."""
        turns = self._turns
        if not turns:
            return None
        if self._running < self.workers:
            return turns.popleft()
        if self._running < self.workers + self.reserve:
            # The reserve: for the first client in turn with nothing running.
            client = next((c for c in turns if not self._buckets[c].running), None)
            if client is not None:
                turns.remove(client)
            return client
        return None

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while (client := self._next()) is not None:
            bucket = self._buckets[client]
            job = bucket.waiting.popleft()
            if bucket.waiting:
                self._turns.append(client)  # its next job waits for everyone else's turn
            if job.waiter.done():  # its request was cancelled (client gone) before it ran
                self._pending -= 1
                self._forget_if_idle(client)
                continue
            bucket.running += 1
            self._running += 1
            future = loop.run_in_executor(self._executor, job.fn, *job.args)
            # Counted until the call itself ends, not until its waiter gives up: a cancelled
            # request still occupies ZooKeeper until its call returns.
            future.add_done_callback(functools.partial(self._finished, job))

    def _finished(self, job: _Job, done: asyncio.Future[Any]) -> None:
        bucket = self._buckets[job.client]
        bucket.running -= 1
        self._running -= 1
        self._pending -= 1
        self._forget_if_idle(job.client)
        waiter = job.waiter
        if done.cancelled():
            if not waiter.done():
                waiter.cancel()
        elif done.exception() is not None:
            if not waiter.done():
                waiter.set_exception(done.exception())  # type: ignore[arg-type]
        elif not waiter.done():
            waiter.set_result(done.result())
        self._dispatch()

    def _forget_if_idle(self, client: str) -> None:
        bucket = self._buckets.get(client)
        if bucket is not None and bucket.held == 0:
            del self._buckets[client]
