"""``AsyncIdempotentProducer``: the idempotent producer for asyncio applications.

The same producer (:class:`~pidfence.producer.IdempotentProducer`: one session, one lease, the
same seqs, ``pf`` headers, checkpoints and errors) behind coroutines, in confluent-kafka's
``AIOProducer`` and aiokafka's conventions: ``await start()`` (or ``async with``), ``await
produce(...)`` returns the delivered record, ``await send(...)`` returns its future once Kafka's
client holds it, ``await flush()``, ``await close()``.

Nothing waits on the event loop. A record is handed over on the loop when that cannot wait (the
common case: no rollover due, the topic's partitions known, room in librdkafka's queue);
otherwise (:mod:`~pidfence.producer.blocking`) the same call runs on the executor, as do the
lease server calls (lease, resume, roll, bump, the checkpoint's ownership question), flushes and
``close``. Delivery reports are served by
one thread per producer and settle the futures on the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Self, TypeVar, Unpack

from pidfence.producer import forks
from pidfence.producer.blocking import WouldBlock, nonblocking
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.config import ProducerConfig
from pidfence.producer.delivery import delivery_error
from pidfence.producer.driver import Headers, ProducerOptions, SaveCheckpoint
from pidfence.producer.errors import ProducerConfigError, ProducerError
from pidfence.producer.idempotent import IdempotentProducer
from pidfence.producer.lease import LeaseClientLike

log = logging.getLogger(__name__)

T = TypeVar("T")
#: What a delivery future resolves to: the acknowledged ``confluent_kafka.Message``.
Delivered = Any


class AsyncIdempotentProducer:
    """An :class:`~pidfence.producer.IdempotentProducer` for asyncio.

    Construct it (no I/O), then ``await start()`` to lease a pid, or use ``async with`` (start,
    then close); :meth:`resume` continues a checkpoint instead. Records one task sends one after
    another keep their order; tasks may share the producer.

    Args:
        config: the producer settings (``success_reports`` on: a future per record).
        lease_client: a :class:`pidfence.pid_allocator.LeaseClient`.
        executor: runs what may wait (None: the loop's default executor).
        options: ``IdempotentProducer``'s (``ledger``, ``clock``, ``producer_factory``,
            ``on_roll``; ``on_roll`` runs on the executor).

    Raises:
        ProducerConfigError: ``success_reports=False``.
    """

    def __init__(
        self,
        config: ProducerConfig,
        lease_client: LeaseClientLike,
        *,
        executor: Executor | None = None,
        **options: Unpack[ProducerOptions],
    ) -> None:
        if not config.success_reports:
            raise ProducerConfigError(
                "the asyncio producer settles each record's future from its delivery report: "
                "use success_reports=True (the default)"
            )
        self._open: Callable[[], IdempotentProducer] = functools.partial(
            IdempotentProducer, config, lease_client, **options
        )
        self._executor = executor
        self._sync: IdempotentProducer | None = None
        self._closing = False
        self._settled: deque[tuple[asyncio.Future[Delivered], Any, Any]] = deque()
        self._scheduled = False
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        forks.register(self)

    @classmethod
    async def resume(
        cls,
        checkpoint: ProducerCheckpoint,
        lease_client: LeaseClientLike,
        config: ProducerConfig,
        *,
        executor: Executor | None = None,
        **kwargs: Any,
    ) -> AsyncIdempotentProducer:
        """A started producer continuing ``checkpoint`` (``IdempotentProducer.resume`` on the
        executor: the lease server's bump or roll, the FENCE records and the recovery scan).
        ``kwargs``: ``IdempotentProducer.resume``'s."""
        self = cls(config, lease_client, executor=executor)
        self._open = functools.partial(
            IdempotentProducer.resume, checkpoint, lease_client, config, **kwargs
        )
        await self.start()
        return self

    async def start(self) -> None:
        """Lease a pid (or resume) on the executor and start serving delivery reports."""
        if self._sync is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._sync = await self._run(self._open)
        self._poller = threading.Thread(
            target=self._serve_reports, name="pidfence-delivery-reports", daemon=True
        )
        self._poller.start()

    @property
    def producer(self) -> IdempotentProducer:
        """The producer underneath (``state``, ``acked``, ``sequencer``, ...).

        Raises:
            ProducerError: not started.
        """
        if self._sync is None:
            raise ProducerError("the producer is not started: await start() first")
        return self._sync

    async def send(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
        event_id: str | None = None,
    ) -> asyncio.Future[Delivered]:
        """Hand one record to Kafka's client; returns the future of its delivery.

        The future resolves to the acknowledged ``confluent_kafka.Message`` or raises
        ``DeliveryFailed`` (which the next :meth:`flush` raises too, as the producer's does).

        Raises:
            What :meth:`IdempotentProducer.produce` raises, for this record.
        """
        sync = self.producer
        loop = asyncio.get_running_loop()
        delivered: asyncio.Future[Delivered] = loop.create_future()
        report = functools.partial(self._report, delivered)
        call = functools.partial(
            sync.produce, topic, value, key, partition, headers, report, event_id
        )
        if not self._closing:
            try:
                with nonblocking():
                    call()
                return delivered
            except WouldBlock:
                pass  # nothing was handed over: the same call, where it may wait
        await self._run(call)
        return delivered

    async def produce(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
        event_id: str | None = None,
    ) -> Delivered:
        """Send one record and wait for Kafka's acknowledgement; returns the delivered
        ``confluent_kafka.Message`` (topic, partition, offset).

        Raises:
            DeliveryFailed: Kafka did not acknowledge it.
            What :meth:`send` raises.
        """
        return await (await self.send(topic, value, key, partition, headers, event_id))

    async def flush(self, timeout: float | None = None) -> int:
        """Wait for what is in flight; returns how many are left (``IdempotentProducer.flush``).

        Raises:
            DeliveryFailed / LedgerWriteFailed / LedgerRefused: the first error since the last.
        """
        try:
            return await self._run(self.producer.flush, timeout)
        finally:
            self._settle()

    async def roll(self, save: SaveCheckpoint | None = None) -> ProducerCheckpoint:
        """Roll over to the pid's successor now, on the executor (``IdempotentProducer.roll``)."""
        return await self._run(self.producer.roll, save)

    async def bump(self) -> ProducerCheckpoint:
        """A new generation of the same pid, on the executor (``IdempotentProducer.bump``)."""
        return await self._run(self.producer.bump)

    async def checkpoint(self) -> ProducerCheckpoint:
        """What to store with the upstream position (``IdempotentProducer.checkpoint`` on the
        executor: it asks the lease authority whether this instance was replaced).

        Raises:
            NotFlushed / DeliveryFailed / ProducerFenced / LeaseServerDown: as the producer's.
        """
        return await self._run(self.producer.checkpoint)

    async def close(self, timeout: float = 30.0) -> None:
        """Flush, close the producer and stop serving reports; idempotent."""
        sync, poller = self._sync, self._poller
        if sync is None or poller is None:
            return
        self._closing = True  # later sends wait on the executor, not on the loop
        try:
            await self._run(sync.close, timeout)
        finally:
            self._stop.set()
            await self._run(poller.join)
            self._settle()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __len__(self) -> int:
        return len(self.producer)  # records in flight

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(call, *args))

    def _serve_reports(self) -> None:
        poll = self.producer.poll
        while not self._stop.is_set():
            try:
                poll(0.1)
            except Exception:
                log.exception("serving delivery reports failed; serving on")

    def _report(self, delivered: asyncio.Future[Delivered], err: Any, msg: Any) -> None:
        """A delivery report, on whichever thread served it: settled on the loop, in batches
        (one wake-up of the loop for all the reports it has not settled yet)."""
        self._settled.append((delivered, err, msg))
        if not self._scheduled:
            self._scheduled = True
            loop = self._loop
            try:
                if loop is not None:
                    loop.call_soon_threadsafe(self._settle)
            except RuntimeError:  # the loop is closed: nobody awaits these futures any more
                self._settled.clear()

    def _settle(self) -> None:
        self._scheduled = False  # before taking: a report appended after this schedules again
        settled = self._settled
        while settled:
            delivered, err, msg = settled.popleft()
            if delivered.done():  # cancelled by its caller
                continue
            if err is None:
                delivered.set_result(msg)
            else:
                delivered.set_exception(delivery_error(err, msg))
