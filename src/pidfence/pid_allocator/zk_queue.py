"""A bounded queue in front of ZooKeeper: floods get RATE_LIMITED instead of queueing forever.

Every request that needs ZooKeeper (bumps, rolls) goes through :class:`ZkQueue`. At most
``limit`` jobs wait or run at once, and one client at most ``share`` of them, so a client that
floods the server with bumps gets ``RATE_LIMITED`` (retriable) while everyone else's requests
still reach ZooKeeper. Block claims do not queue here: they have their own executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from pidfence.pid_allocator.errors import RateLimited

T = TypeVar("T")


class ZkQueue:
    """Runs blocking coordinator calls on ``executor``, bounded overall and per client.

    Args:
        executor: where the calls run.
        limit: jobs queued or running at most.
        share: jobs one client may have queued or running at most.
    """

    def __init__(self, executor: Executor, limit: int, share: int) -> None:
        self._executor = executor
        self.limit = limit
        self.share = share
        self._pending = 0
        self._by_client: dict[str, int] = {}
        self.refused = 0

    @property
    def pending(self) -> int:
        """Jobs queued or running now."""
        return self._pending

    async def run(self, client: str, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the executor.

        Raises:
            RateLimited: the queue, or this client's share of it, is full.
        """
        held = self._by_client.get(client, 0)
        if self._pending >= self.limit or held >= self.share:
            self.refused += 1
            raise RateLimited(
                "lease server busy: too many ZooKeeper requests queued"
                + (" from this client" if held >= self.share else "")
                + "; retry after a short pause"
            )
        self._pending += 1
        self._by_client[client] = held + 1
        job = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        # Counted until the job itself ends, not until its waiter gives up: a cancelled request
        # (client gone) still occupies ZooKeeper until its call returns.
        job.add_done_callback(lambda done: self._done(client, done))
        return await asyncio.shield(job)

    def _done(self, client: str, job: asyncio.Future[T]) -> None:
        if not job.cancelled():
            job.exception()  # retrieved: a waiter that gave up must not leave a warning behind
        self._pending -= 1
        left = self._by_client[client] - 1
        if left:
            self._by_client[client] = left
        else:
            del self._by_client[client]
