"""Threads sharing one ``IdempotentProducer`` (issue 42), on an in-memory client, and forks.

The client keeps each partition's log in the order ``produce`` is called, as librdkafka's
partition queue does, so what these tests read back is the order the broker would get. The
interpreter switches threads as often as it can (``sys.setswitchinterval(1e-6)``), the queue
is full now and then, and the threads mix every way of sending: the stamping loop, the general
path (user headers) and ``produce_many``. The seeded mutant ``producer-without-lock``
(``pidfence.testing.mutations``) must fail the same check.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from pidfence.producer import (
    IdempotentProducer,
    ProducerConfig,
    ProducerError,
    ProducerForked,
)
from pidfence.producer import lock as producer_lock
from pidfence.testing.mutations import install_mutation
from pidfence.wire import FLAG_FENCE, PidfenceError, decode_pf
from tests.unit.kafka_kit import Message
from tests.unit.producer_kit import LIFETIME, FakeLeaseClient

THREADS = 4
PER_THREAD = 2_000
PARTITIONS = 4


class ThreadedKafka:
    """An in-memory client any thread may call: each partition's log in ``produce`` call order;
    any thread's ``poll`` serves reports (with the error ``fail``, if set); every
    ``full_every``-th ``produce`` finds the queue full (``BufferError``, nothing taken)."""

    def __init__(self, conf: dict[str, Any], full_every: int = 0) -> None:
        self.conf = conf
        self.full_every = full_every
        self.fail: Any = None
        self.log: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(PARTITIONS)}
        self.reports: deque[tuple[Any, Message]] = deque()
        self._calls = itertools.count(1)

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int = -1,
        headers: Any = None,
        on_delivery: Any = None,
    ) -> None:
        if self.full_every and next(self._calls) % self.full_every == 0:
            raise BufferError("queue full")
        log = self.log[partition]
        log.append((dict(headers)["pf"], value))
        callback = on_delivery or self.conf["on_delivery"]
        self.reports.append((callback, Message(topic, partition, len(log) - 1, value_=value)))

    def poll(self, timeout: float = 0) -> int:
        served = 0
        while True:
            try:
                callback, report = self.reports.popleft()
            except IndexError:
                return served
            callback(self.fail, report)
            served += 1

    def flush(self, timeout: float = -1) -> int:
        self.poll()
        return len(self.reports)

    def __len__(self) -> int:
        return len(self.reports)

    def list_topics(self, topic: str, timeout: float) -> Any:
        parts = {p: object() for p in range(PARTITIONS)}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=parts)})


class Rig:
    """A producer over :class:`ThreadedKafka` and the in-memory lease rules, on a manual clock."""

    def __init__(self, full_every: int = 97) -> None:
        self.now = 1_000_000
        self.lease = FakeLeaseClient(lambda: self.now)
        self.full_every = full_every
        self.kafka: ThreadedKafka | None = None

    def factory(self, conf: dict[str, Any]) -> ThreadedKafka:
        self.kafka = ThreadedKafka(conf, self.full_every)
        return self.kafka

    def producer(self, **kwargs: Any) -> IdempotentProducer:
        return IdempotentProducer(
            ProducerConfig("127.0.0.1:9", message_timeout_ms=500),
            self.lease,
            clock=lambda: self.now,
            producer_factory=self.factory,
            **kwargs,
        )


@contextmanager
def switching_often() -> Iterator[None]:
    """The interpreter switches threads as often as it can (a busy server now and then)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def in_threads(work: Callable[[int], None], threads: int = THREADS) -> None:
    """Run ``work(t)`` on ``threads`` threads at once; re-raise the first error."""
    start = threading.Barrier(threads)

    def run(t: int) -> None:
        start.wait()
        work(t)

    with switching_often(), ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(run, t) for t in range(threads)]:
            future.result()


def send_mixed(producer: IdempotentProducer, layout: str) -> Callable[[int], None]:
    """Thread ``t``'s work: chunks of 10 values by the stamping loop, the general path and
    ``produce_many`` in turn, to partition 0 (``one``) or keyed over 4 partitions (``keyed``);
    it serves delivery reports now and then, as applications' threads do."""

    def work(t: int) -> None:
        for chunk in range(PER_THREAD // 10):
            values = [b"%d-%d" % (t, chunk * 10 + j) for j in range(10)]
            keys: list[bytes | None] = values if layout == "keyed" else [None] * 10
            partition = 0 if layout == "one" else None
            if chunk % 3 == 0:
                for value, key in zip(values, keys, strict=True):
                    producer.produce("t", value, key=key, partition=partition)
            elif chunk % 3 == 1:
                for value, key in zip(values, keys, strict=True):
                    producer.produce("t", value, key, partition, headers=[("trace", b"1")])
            else:
                producer.produce_many("t", values, keys=keys, partition=partition)
            if chunk % 10 == 0:
                producer.poll(0)

    return work


def problems(kafka: ThreadedKafka, sent: int, start: int = 0) -> list[str]:
    """What is wrong with the logs (FENCE records aside): a (pid, generation, partition, seq)
    on two records, a partition whose seqs are not ``start`` (0 for a successor pid), +1, +2,
    ... in log order per pid, a value not there once."""
    found: list[str] = []
    identities: Counter[tuple[int, int, int, int]] = Counter()
    values: Counter[bytes] = Counter()
    for partition, records in kafka.log.items():
        seqs: dict[int, list[int]] = {}
        for raw, value in records:
            pf = decode_pf(raw)
            if pf.flags & FLAG_FENCE:
                continue
            identities[(pf.pid, pf.generation, partition, pf.seq)] += 1
            seqs.setdefault(pf.pid, []).append(pf.seq)
            values[value] += 1
        for pid, order in seqs.items():
            first = start if pid == min(seqs) else 0
            if order != list(range(first, first + len(order))):
                found.append(f"partition {partition}, pid {pid}: seqs out of log order")
    shared = sum(n for n in identities.values() if n > 1)
    if shared:
        found.append(f"{shared} records share their identity with another")
    if sorted(values.values()) != [1] * sent:
        found.append(f"{len(values)} distinct values of {sent} sent, some more than once")
    return found


@pytest.mark.parametrize("layout", ["one", "keyed"])
def test_threads_sharing_a_producer_never_share_an_identity(layout: str) -> None:
    rig = Rig()
    producer = rig.producer()
    in_threads(send_mixed(producer, layout))
    assert producer.flush() == 0
    assert rig.kafka is not None
    assert problems(rig.kafka, THREADS * PER_THREAD) == []
    assert producer.acked == THREADS * PER_THREAD  # reports served on every thread, none lost
    if layout == "keyed":
        assert all(len(log) > PER_THREAD // 2 for log in rig.kafka.log.values())


def test_threads_stamp_every_header_form_without_sharing_an_identity() -> None:
    """Seqs past 65,535 take the stamping loop's third form (``Sequencer.header``, a Python
    call: where the unguarded loop let another thread in): a resumed checkpoint starts there."""
    rig = Rig()
    start = 0x10000 - 3_000
    checkpoint = dataclasses.replace(rig.producer().checkpoint(), next_seq={("t", 0): start})
    producer = IdempotentProducer.resume(
        checkpoint,
        rig.lease,
        ProducerConfig("127.0.0.1:9", message_timeout_ms=500),
        clock=lambda: rig.now,
        producer_factory=rig.factory,
        scanner=lambda *args: None,
    )
    in_threads(send_mixed(producer, "one"))
    assert producer.flush() == 0
    assert rig.kafka is not None
    assert problems(rig.kafka, THREADS * PER_THREAD, start) == []
    assert decode_pf(rig.kafka.log[0][-1][0]).seq == start + THREADS * PER_THREAD - 1


def test_without_the_lock_threads_share_identities(monkeypatch: pytest.MonkeyPatch) -> None:
    """The teeth of the test above: the seeded mutant fails it. A race shows only when the
    threads interleave inside the unguarded stamping, which a loaded machine can miss in one run;
    the mutant must show within ten (it shows in the first on an idle machine)."""
    monkeypatch.setattr(producer_lock, "SimpleQueue", producer_lock.SimpleQueue)  # undone after
    install_mutation("producer-without-lock")
    found: list[str] = []
    for _ in range(10):
        rig = Rig()
        producer = rig.producer()
        in_threads(send_mixed(producer, "one"))
        producer.flush()
        assert rig.kafka is not None
        found = [
            p for p in problems(rig.kafka, THREADS * PER_THREAD) if "share their identity" in p
        ]
        if found:
            break
    assert found


def test_a_rollover_racing_threads_drains_before_the_successor_sends() -> None:
    """One thread finds the rollover due and rolls (drain, roll, ``on_roll``) while the others
    wait: no record goes out under the old pid after the successor's first, none is refused."""
    rig = Rig()
    saved: list[int] = []
    producer = rig.producer(on_roll=lambda cp: saved.append(cp.pid))
    first = producer.sequencer.pid

    def work(t: int) -> None:
        send_mixed(producer, "keyed")(t)
        if t == 0:
            rig.now += LIFETIME * 23 // 24 + 1  # the rollover falls due mid-stream
        send_mixed(producer, "keyed")(t + THREADS)

    in_threads(work)
    assert producer.flush() == 0
    assert saved == [producer.sequencer.pid] and saved[0] != first
    assert rig.kafka is not None
    assert problems(rig.kafka, 2 * THREADS * PER_THREAD) == []
    for log in rig.kafka.log.values():
        pids = [decode_pf(raw).pid for raw, _ in log]
        assert pids == sorted(pids, key=lambda pid: pid != first)  # old pid's records first


def test_close_racing_threads_leaves_nothing_in_flight() -> None:
    """``close`` waits for the step in progress; every record handed over is acknowledged when
    it returns, and later sends are refused (``CLOSED``)."""
    rig = Rig(full_every=0)
    producer = rig.producer()
    refused: list[str] = []

    def work(t: int) -> None:
        if t == 0:
            while producer.acked < 500:
                producer.poll(0)
            producer.close()
            return
        for i in itertools.count():
            try:
                producer.produce("t", b"%d-%d" % (t, i), partition=t % PARTITIONS)
            except ProducerError as exc:
                refused.append(str(exc))
                return

    in_threads(work)
    assert rig.kafka is not None
    handed = sum(len(log) for log in rig.kafka.log.values())
    assert len(rig.kafka) == 0 and producer.acked == handed
    assert len(refused) == THREADS - 1 and all("CLOSED" in r for r in refused)


def test_callbacks_run_under_the_lock_may_call_back_in() -> None:
    """``on_roll`` and delivery reports served while the producer holds its lock (a rollover's
    drain, ``close``) call back into it on the same thread: no deadlock, as before threads."""
    rig = Rig(full_every=0)
    saved: list[int] = []
    follow_ups: list[int] = []

    def on_roll(cp: Any) -> None:
        saved.append(producer.checkpoint().pid)  # the successor's, taken inside the roll

    def on_delivery(err: Any, msg: Any) -> None:
        if not follow_ups:
            follow_ups.append(producer.produce("t", b"follow-up", partition=1))

    producer = rig.producer(on_roll=on_roll)

    def run() -> None:
        producer.produce("t", b"a", partition=0)
        rig.now += LIFETIME * 23 // 24 + 1
        producer.produce("t", b"b", partition=0)  # rolls: drain, roll, on_roll
        producer.produce("t", b"c", partition=0, on_delivery=on_delivery)
        producer.close()  # serves c's report, which sends the follow-up

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "a callback calling back into the producer deadlocked"
    assert saved == [producer.sequencer.pid] and follow_ups == [1]


def test_the_lock_stays_one_token_however_its_regions_nest() -> None:
    """Re-entry on the holding thread (a callback calling back in, also after a ``marked``
    region inside) neither waits nor gives the token back early: while the outer region runs,
    no other thread can take it, and after it exactly one token is there."""
    lock = producer_lock.ProducerLock()
    failures: list[BaseException] = []

    def nest() -> None:
        try:
            with lock.held():
                with lock.held():
                    pass
                assert lock.marked(lambda: 5) == 5
                with lock.held():  # still this thread's region: does not wait for itself
                    pass
                with pytest.raises(producer_lock.Empty):
                    lock.take()  # what another thread would try now
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failures.append(exc)

    worker = threading.Thread(target=nest, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "re-entering the lock on its own thread deadlocked"
    assert failures == []
    lock.take()
    with pytest.raises(producer_lock.Empty):
        lock.take()


def _use_in_child(producer: IdempotentProducer, out: Any) -> None:
    """In the forked child: every use of the parent's producer is refused, yet what it is can
    still be asked (its class, ``isinstance`` of an unrelated type)."""
    try:
        seen: tuple[object, ...] = (producer.__class__.__name__, isinstance(producer, int))
    except PidfenceError as exc:
        seen = (type(exc).__name__,)
    uses: dict[str, tuple[Any, ...]] = {
        "produce": ("t", b"child", None, 0),
        "produce_many": ("t", [b"child"]),
        "flush": (),
        "checkpoint": (),
        "__len__": (),
        "close": (),
    }
    errors = {}
    for name, args in uses.items():
        try:
            getattr(producer, name)(*args)
            errors[name] = "no error"
        except PidfenceError as exc:
            errors[name] = f"{type(exc).__name__} retriable={exc.retriable}: {exc}"
    out.send((errors, seen))


def test_a_producer_used_after_fork_is_refused_in_the_child() -> None:
    rig = Rig(full_every=0)
    producer = rig.producer()
    producer.produce("t", b"before", partition=0)
    receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_use_in_child, args=(producer, send))
    child.start()
    errors, seen = receive.recv()
    child.join(30)
    assert child.exitcode == 0
    assert seen == ("ForkedIdempotentProducer", False)
    for name, error in errors.items():
        assert error.startswith("ProducerForked retriable=False"), (name, error)
        assert "create the producer after the fork" in error.lower(), error
    # The parent's producer goes on, its seqs untouched by the child.
    producer.produce("t", b"after", partition=0)
    assert producer.flush() == 0
    assert rig.kafka is not None
    assert [decode_pf(raw).seq for raw, _ in rig.kafka.log[0]] == [0, 1]
    assert issubclass(ProducerForked, ProducerError) and not ProducerForked.retriable


def race_a_send_with_a_bump(rig: Rig) -> tuple[Any, Any, bool]:
    """A thread bumps (a copy group's proof before it commits) while another sends: the send
    starts while the lease server is still answering the bump. Returns the send's ``pf``, the
    bump's checkpoint, and whether the send finished before the answer came."""
    producer = rig.producer()
    producer.produce("t", b"before", partition=0)
    assert producer.flush() == 0
    asked, answer = threading.Event(), threading.Event()
    bump = rig.lease.bump

    def slow_bump(*args: Any, **kwargs: Any) -> Any:
        asked.set()
        answer.wait(30)
        return bump(*args, **kwargs)

    rig.lease.bump = slow_bump  # type: ignore[method-assign]
    with ThreadPoolExecutor(2) as pool:
        bumped = pool.submit(producer.bump)
        asked.wait(30)
        sent = pool.submit(producer.produce, "t", b"racer", partition=0)
        try:
            sent.result(timeout=0.5)  # with the lock it waits for the bump: no result yet
            early = True
        except TimeoutError:
            early = False
        answer.set()
        checkpoint, _ = bumped.result(30), sent.result(30)
    assert producer.flush() == 0 and rig.kafka is not None
    racer = next(pf for pf, value in rig.kafka.log[0] if value == b"racer")
    return decode_pf(racer), checkpoint, early


def test_a_send_racing_a_bump_goes_under_the_new_generation() -> None:
    """The send waits for the bump (the lock): nothing is handed over between the bump's idle
    check and its new generation, so the checkpoint covers every record sent before it and the
    racer is the first under the new generation, at the seq the checkpoint says comes next."""
    rig = Rig(full_every=0)
    pf, checkpoint, early = race_a_send_with_a_bump(rig)
    assert not early
    assert (pf.generation, pf.seq) == (checkpoint.generation, checkpoint.next_seq[("t", 0)])


def test_without_the_lock_a_send_slips_into_a_bump(monkeypatch: pytest.MonkeyPatch) -> None:
    """The teeth of the test above: unguarded, the racer goes out under the old generation
    while the bump is in flight, and the bump's checkpoint already counts it as sent."""
    monkeypatch.setattr(producer_lock, "SimpleQueue", producer_lock.SimpleQueue)  # undone after
    install_mutation("producer-without-lock")
    rig = Rig(full_every=0)
    pf, checkpoint, early = race_a_send_with_a_bump(rig)
    assert early and pf.generation == checkpoint.generation - 1
