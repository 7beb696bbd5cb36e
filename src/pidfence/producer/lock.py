"""``ProducerLock``: the lock around each step of a producer shared by threads.

A step is what must not interleave with another thread's: taking a partition's next seq,
stamping it and handing the record to librdkafka (librdkafka's own ``rd_kafka_toppar_enq_msg``
assigns its message ids and enqueues under the partition's lock the same way), a rollover, a
checkpoint, ``close``.

The lock is one token in a ``queue.SimpleQueue``: ``take`` (``get_nowait``) and ``give``
(``put_nowait``) cost about a third of an ``RLock``'s acquire and release on CPython 3.11,
whose acquire reads the monotonic clock on every call (bench/results/produce_threads.md), and
the stamping loop takes it once per record. A thread that finds the token gone waits in
:meth:`ProducerLock.wait`, unless it holds the lock itself: a callback the producer runs while
holding it (``on_roll``, a delivery report served by a rollover's drain or by ``close``) may call
back into the producer, as it could before threads shared it, so those regions mark their
thread (:meth:`held`, :meth:`marked`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from queue import Empty, SimpleQueue
from threading import get_ident
from typing import ParamSpec, TypeVar

from pidfence.producer.blocking import may_block

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["Empty", "ProducerLock"]


class ProducerLock:
    """One producer's lock.

    The per-record path inlines it: ``take()``, on ``Empty`` ``wait()`` (False: this thread
    holds it already, do not give it back), then ``give(None)``.
    """

    def __init__(self) -> None:
        self._queue: SimpleQueue[None] = SimpleQueue()
        self._queue.put(None)
        #: Take the lock if it is free (``Empty`` otherwise); give it back.
        self.take, self.give = self._queue.get_nowait, self._queue.put_nowait
        #: The thread holding the lock in a region that may run callbacks, else 0.
        self._holder = 0

    def wait(self) -> bool:
        """Wait for the lock and take it; False when this thread holds it already.

        Raises:
            WouldBlock: on a thread that must not wait (the asyncio producer's event loop,
                :func:`~pidfence.producer.blocking.nonblocking`), before anything was taken:
                the call runs again on the executor.
        """
        if self._holder == get_ident():
            return False
        may_block()  # a bump or a rollover may hold the lock for up to a minute
        self._queue.get()
        return True

    def marked(self, call: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``call`` while holding the lock, where it may run callbacks that call back in."""
        holder, self._holder = self._holder, get_ident()
        try:
            return call(*args, **kwargs)
        finally:
            self._holder = holder

    @contextmanager
    def held(self) -> Iterator[None]:
        """Take the lock (waiting) and hold it, callbacks allowed to call back in."""
        try:
            self.take()
            mine = True
        except Empty:
            mine = self.wait()
        holder, self._holder = self._holder, get_ident()
        try:
            yield
        finally:
            self._holder = holder
            if mine:
                self.give(None)
