"""``AsyncIdempotentProducer`` on the in-memory client of ``test_producer_threads``.

Every call of the fakes that may wait (a lease server call, a metadata request, a flush, a poll
that waits for room in a full queue) notes the thread it ran on: none may be the event loop's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import confluent_kafka
import pytest

from pidfence.producer import (
    AsyncIdempotentProducer,
    DeliveryFailed,
    ProducerConfig,
    ProducerConfigError,
)
from pidfence.wire import PidState, PidStatus, decode_pf
from tests.unit.producer_kit import LIFETIME, FakeLeaseClient
from tests.unit.test_producer_threads import ThreadedKafka, problems


class Waits:
    """The threads that made a call which may wait, by call."""

    def __init__(self) -> None:
        self.threads: dict[str, set[int]] = {}

    def note(self, call: str) -> None:
        self.threads.setdefault(call, set()).add(threading.get_ident())


class WatchedKafka(ThreadedKafka):
    def __init__(self, conf: dict[str, Any], full_every: int, waits: Waits) -> None:
        super().__init__(conf, full_every)
        self.waits = waits

    def poll(self, timeout: float = 0) -> int:
        if timeout:
            self.waits.note("poll")
        return super().poll(timeout)

    def flush(self, timeout: float = -1) -> int:
        self.waits.note("flush")
        self.poll()
        return len(self.reports)

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.waits.note("metadata")
        return super().list_topics(topic, timeout)


class WatchedLease(FakeLeaseClient):
    def __init__(self, clock: Any, waits: Waits) -> None:
        super().__init__(clock)
        self.waits = waits

    def lease(self, *args: Any, **kwargs: Any) -> Any:
        self.waits.note("lease")
        return super().lease(*args, **kwargs)

    def roll(self, *args: Any, **kwargs: Any) -> Any:
        self.waits.note("roll")
        return super().roll(*args, **kwargs)

    def bump(self, *args: Any, **kwargs: Any) -> Any:
        self.waits.note("bump")
        return super().bump(*args, **kwargs)

    def describe(self, pid: int) -> PidStatus:
        self.waits.note("describe")
        return PidStatus(pid, PidState.LIVE, self.latest[pid], self.expire[pid])


class AioRig:
    def __init__(self, full_every: int = 0) -> None:
        self.now = 1_000_000
        self.waits = Waits()
        self.lease = WatchedLease(lambda: self.now, self.waits)
        self.full_every = full_every
        self.kafka: WatchedKafka | None = None
        self.config = ProducerConfig("127.0.0.1:9", message_timeout_ms=500)

    def factory(self, conf: dict[str, Any]) -> WatchedKafka:
        self.kafka = WatchedKafka(conf, self.full_every, self.waits)
        return self.kafka

    def producer(self, **kwargs: Any) -> AsyncIdempotentProducer:
        return AsyncIdempotentProducer(
            self.config, self.lease, clock=lambda: self.now, producer_factory=self.factory, **kwargs
        )


def test_tasks_write_through_the_async_api_and_nothing_waits_on_the_loop() -> None:
    """Tasks send and await deliveries; the queue is full now and then, a rollover falls due
    mid-stream: every record is delivered once, identities are unique, and every call that may
    wait (lease, roll, bump, metadata, flush, waiting for room) ran off the loop."""
    rig = AioRig(full_every=13)
    rolled: list[int] = []

    async def app() -> tuple[list[Any], int]:
        loop_thread = threading.get_ident()
        async with rig.producer(on_roll=lambda cp: rolled.append(cp.pid)) as producer:

            async def task(t: int) -> list[Any]:
                got = []
                for i in range(300):
                    if t == 0 and i == 150:
                        rig.now += LIFETIME * 23 // 24 + 1  # the rollover falls due
                    value, key = b"%d-%d" % (t, i), b"k%d" % i
                    if i % 2:
                        got.append(await producer.produce("t", value, key=key))
                    else:
                        got.append(await producer.send("t", value, key=key, event_id=f"{t}:{i}"))
                return got

            results = await asyncio.gather(*(task(t) for t in range(4)))
            assert await producer.flush() == 0
            assert (await producer.bump()).generation == producer.producer.sequencer.generation
            assert (await producer.checkpoint()).generation == rig.lease.latest[rolled[0]]
            got = [r for rs in results for r in rs]
            delivered = [await r if isinstance(r, asyncio.Future) else r for r in got]
        return delivered, loop_thread

    delivered, loop_thread = asyncio.run(app())
    assert len(delivered) == 1200 and all(d.value() for d in delivered)
    assert rig.kafka is not None
    assert problems(rig.kafka, 1200) == []
    assert len(rolled) == 1
    assert {"lease", "roll", "bump", "describe", "metadata", "flush", "poll"} <= set(
        rig.waits.threads
    )
    for call, threads in rig.waits.threads.items():
        assert loop_thread not in threads, f"{call} ran on the event loop"


def test_a_failed_delivery_raises_from_its_future_and_from_flush() -> None:
    rig = AioRig()

    async def app() -> None:
        async with rig.producer() as producer:
            assert rig.kafka is not None
            rig.kafka.fail = confluent_kafka.KafkaError(confluent_kafka.KafkaError._MSG_TIMED_OUT)
            with pytest.raises(DeliveryFailed, match="resume from the last checkpoint"):
                await producer.produce("t", b"lost", partition=0)
            with pytest.raises(DeliveryFailed):
                await producer.flush()
            rig.kafka.fail = None
            delivered = await producer.produce("t", b"kept", partition=0)
            assert delivered.value() == b"kept"

    asyncio.run(app())
    assert rig.kafka is not None
    assert [decode_pf(raw).seq for raw, _ in rig.kafka.log[0]] == [0, 1]


def test_resume_runs_off_the_loop_and_continues_the_checkpoint() -> None:
    rig = AioRig()

    async def app() -> None:
        async with rig.producer() as first:
            await first.produce("t", b"a", partition=1)
            await first.flush()
            checkpoint = await first.checkpoint()
        resumed = await AsyncIdempotentProducer.resume(
            checkpoint,
            rig.lease,
            rig.config,
            clock=lambda: rig.now,
            producer_factory=rig.factory,
            scanner=lambda *args: None,
        )
        async with resumed:
            assert resumed.producer.resumed_how == "bumped"
            await resumed.produce("t", b"b", partition=1)

    asyncio.run(app())
    assert rig.kafka is not None
    pfs = [decode_pf(raw) for raw, _ in rig.kafka.log[1]]
    assert [(pf.seq, pf.flags) for pf in pfs] == [(1, 1), (1, 0)]  # FENCE, then seq 1


def test_success_reports_off_is_refused() -> None:
    config = ProducerConfig("127.0.0.1:9", success_reports=False)
    with pytest.raises(ProducerConfigError, match="success_reports=True"):
        AsyncIdempotentProducer(config, FakeLeaseClient(lambda: 0))


class SlowFlushKafka(WatchedKafka):
    """Kafka acknowledging a bump's FENCE after 2 s (flushes off the main thread wait)."""

    def flush(self, timeout: float = -1) -> int:
        if threading.current_thread() is not threading.main_thread():
            time.sleep(2.0)
        return super().flush(timeout)


def test_a_send_while_a_bump_holds_the_producer_does_not_stop_the_event_loop() -> None:
    """A bump holds the producer's lock until its FENCE is acknowledged (up to a minute): a
    send on the loop meanwhile waited for the lock there, and the loop froze. It now moves to
    the executor, and the loop goes on."""
    rig = AioRig()

    def slow(conf: dict[str, Any]) -> WatchedKafka:
        rig.kafka = SlowFlushKafka(conf, 0, rig.waits)
        return rig.kafka

    rig.factory = slow  # type: ignore[method-assign]

    async def app() -> float:
        async with rig.producer() as producer:
            await producer.produce("t", b"x", partition=0)
            gaps: list[float] = []

            async def heartbeat() -> None:
                last = time.monotonic()
                for _ in range(40):
                    await asyncio.sleep(0.05)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            beats = asyncio.create_task(heartbeat())
            bump = asyncio.create_task(producer.bump())
            await asyncio.sleep(0.2)  # the bump holds the lock, waiting for its FENCE
            delivered = await producer.send("t", b"y", partition=0)
            await bump
            await beats
            assert (await delivered).value() == b"y"
            return max(gaps)

    assert asyncio.run(app()) < 1.0
