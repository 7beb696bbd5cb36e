"""The producer as applications use it (issue 42), against real Kafka, lease server and sink.

* Four threads share one ``IdempotentProducer`` while the interpreter switches threads as often
  as it can (``sys.setswitchinterval(1e-6)``), on one partition and keyed over four: every record
  read back from Kafka has its own (pid, generation, seq), each partition's seqs are in log
  order, and ``pidfence verify`` on a sink run over the topic finds every event exactly once.
  With the seeded mutant ``producer-without-lock`` the same workload puts records on one
  identity (the check has teeth).
* An asyncio application writes through ``AsyncIdempotentProducer`` (its own send ledger) and
  the sink's output is exact.
* A producer used in a process forked from the one that created it is refused; the parent's
  records are all there, once.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pidfence.cli.exits import EXIT_OK
from pidfence.ledger import LedgerEntry, LedgerWriter, value_digest
from pidfence.pid_allocator import LeaseClient, LeaseServerThread
from pidfence.producer import (
    AsyncIdempotentProducer,
    IdempotentProducer,
    ProducerConfig,
    ProducerForked,
)
from pidfence.producer import lock as producer_lock
from pidfence.spark_sink import run_sink
from pidfence.testing.mutations import install_mutation
from tests.fixtures.commands import run_pidfence
from tests.fixtures.produced import Record, assert_gap_free, read_topic
from tests.unit.test_producer_threads import in_threads

THREADS = 4
PER_THREAD = 10_000


def send_as_threads_do(producer: IdempotentProducer, topic: str, keyed: bool) -> None:
    """Four threads, ``PER_THREAD`` records each: runs of 10 by ``produce``, by ``produce``
    with a user header (the general path) and by ``produce_many``, in turn; keyed over the
    topic's partitions or all to partition 0; each thread serves reports now and then."""

    def work(t: int) -> None:
        for run in range(PER_THREAD // 10):
            values = [b"%d:%d" % (t, run * 10 + j) for j in range(10)]
            keys: list[bytes | None] = list(values) if keyed else [None] * 10
            partition = None if keyed else 0
            if run % 3 == 0:
                for value, key in zip(values, keys, strict=True):
                    producer.produce(topic, value, key=key, partition=partition)
            elif run % 3 == 1:
                for value, key in zip(values, keys, strict=True):
                    producer.produce(topic, value, key, partition, headers=[("trace", b"t")])
            else:
                producer.produce_many(topic, values, keys=keys, partition=partition)
            if run % 20 == 0:
                producer.poll(0)

    in_threads(work, THREADS)
    assert producer.flush(60) == 0


def shared_identities(records: list[Record]) -> int:
    """Records that carry a (pid, generation, partition, seq) another record carries too."""
    seen = Counter((r.pf.pid, r.pf.generation, r.partition, r.pf.seq) for r in records if r.pf)
    return sum(n for n in seen.values() if n > 1)


def ledger_of(records: list[Record], topic: str, path: Path, expire_ms: int) -> Path:
    """Append the send ledger of ``records`` to ``path`` (each one was acknowledged: read back
    after ``flush()`` gave 0 and no error), the topic and value as its event id."""
    with LedgerWriter(path) as ledger:
        for r in records:
            assert r.pf is not None and r.value is not None
            ledger.write(
                LedgerEntry(
                    r.pf.pid,
                    r.pf.generation,
                    topic,
                    r.partition,
                    r.pf.seq,
                    value_digest(r.value),
                    r.offset,
                    r.ts_ms,
                    expire_ms=expire_ms,
                    event=f"{topic}/{r.value.decode()}",
                )
            )
    return path


def assert_sink_appends_each_once(
    spark: Any, bootstrap: str, topics: str, ledger: Path, tmp_path: Path, count: int
) -> None:
    """One sink run over ``topics`` appends ``count`` rows, and ``pidfence verify`` (as a user
    runs it) finds no event lost or twice."""
    out = tmp_path / "out"
    summary = run_sink(spark, bootstrap, topics, str(out), str(tmp_path / "ckpt"))
    assert summary.appended == count, summary
    done = run_pidfence(
        "verify", "--ledger", str(ledger), "--output", str(out), "--json", timeout=300
    )
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    findings = {n: f["count"] for n, f in json.loads(done.stdout)["findings"].items()}
    assert findings["event_lost"] == findings["event_duplicate"] == findings["lost"] == 0, findings


def written_by_threads(
    bootstrap: str, new_topic: Callable[..., str], lease_server: LeaseServerThread, ledger: Path
) -> tuple[str, int]:
    """The threads write one topic of one partition, then one of four, keyed; their send ledger
    is built from what Kafka holds. Returns the topics (comma-separated) and the record count."""
    layouts = {new_topic(partitions=1): False, new_topic(partitions=4): True}
    with LeaseClient(lease_server.address) as client:
        producer = IdempotentProducer(ProducerConfig(bootstrap), client)
        for topic, keyed in layouts.items():
            send_as_threads_do(producer, topic, keyed)
        expire_ms = producer.sequencer.expire_ms
        producer.close()
    read = 0
    for topic, keyed in layouts.items():
        records = read_topic(bootstrap, topic)
        values = Counter(r.value for r in records)
        assert len(values) == THREADS * PER_THREAD and set(values.values()) == {1}, topic
        assert shared_identities(records) == 0, topic
        assert_gap_free(records)  # per partition, seqs 0, 1, 2, ... in offset order
        assert len({r.partition for r in records}) == (4 if keyed else 1)
        ledger_of(records, topic, ledger, expire_ms)
        read += len(records)
    return ",".join(layouts), read


def written_by_tasks(
    bootstrap: str, new_topic: Callable[..., str], lease_server: LeaseServerThread, ledger: Path
) -> tuple[str, int]:
    """Eight tasks share one ``AsyncIdempotentProducer`` (its own ledger): half their records
    awaited one by one, half sent and awaited together. Returns the topic and the record count."""
    topic = new_topic(partitions=3)
    per_task = 500

    async def app() -> list[Any]:
        with LeaseClient(lease_server.address) as client:
            config = ProducerConfig(bootstrap)
            async with AsyncIdempotentProducer(config, client, ledger=ledger) as producer:

                async def task(t: int) -> list[Any]:
                    delivered = []
                    pending = []
                    for i in range(per_task):
                        value, event = b"%d:%d" % (t, i), f"task{t}:{i}"
                        if i % 2:
                            delivered.append(
                                await producer.produce(topic, value, key=value, event_id=event)
                            )
                        else:
                            pending.append(await producer.send(topic, value, event_id=event))
                    return delivered + list(await asyncio.gather(*pending))

                results = await asyncio.gather(*(task(t) for t in range(8)))
                assert await producer.flush() == 0
        return [message for messages in results for message in messages]

    delivered = asyncio.run(app())
    assert len(delivered) == 8 * per_task
    assert all(m.error() is None and m.offset() >= 0 for m in delivered)
    records = read_topic(bootstrap, topic)
    assert shared_identities(records) == 0
    assert_gap_free(records)
    return topic, 8 * per_task


@pytest.mark.parametrize(
    "write", [written_by_threads, written_by_tasks], ids=["threads", "asyncio"]
)
def test_an_application_sharing_a_producer_writes_every_event_exactly_once(
    kafka: Any,
    spark: Any,
    new_topic: Callable[..., str],
    lease_server: LeaseServerThread,
    tmp_path: Path,
    write: Callable[[str, Callable[..., str], LeaseServerThread, Path], tuple[str, int]],
) -> None:
    """Threads sharing an ``IdempotentProducer``, or asyncio tasks an
    ``AsyncIdempotentProducer``, write; one sink run over what they wrote, one ``pidfence
    verify``."""
    ledger = tmp_path / "ledger.jsonl"
    topics, count = write(kafka.bootstrap, new_topic, lease_server, ledger)
    assert_sink_appends_each_once(spark, kafka.bootstrap, topics, ledger, tmp_path, count)


def test_without_the_lock_threads_put_records_on_one_identity(
    kafka: Any,
    new_topic: Callable[..., str],
    lease_server: LeaseServerThread,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The teeth of the test above: the threads' workload, one partition, on the seeded mutant."""
    monkeypatch.setattr(producer_lock, "SimpleQueue", producer_lock.SimpleQueue)  # undone after
    install_mutation("producer-without-lock")
    topic = new_topic(partitions=1)
    with LeaseClient(lease_server.address) as client:
        producer = IdempotentProducer(ProducerConfig(kafka.bootstrap), client)
        send_as_threads_do(producer, topic, keyed=False)
        producer.close()
    assert shared_identities(read_topic(kafka.bootstrap, topic)) > 0  # 9,220 of 40,000 in one run


def _send_in_child(producer: IdempotentProducer, topic: str, out: Any) -> None:
    try:
        producer.produce(topic, b"from the child", partition=0)
        out.send("sent")
    except ProducerForked as exc:
        out.send(f"refused: {exc}")


def test_a_producer_used_after_fork_is_refused(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread
) -> None:
    topic = new_topic(partitions=1)
    fork = multiprocessing.get_context("fork")
    with LeaseClient(lease_server.address) as client:
        producer = IdempotentProducer(ProducerConfig(kafka.bootstrap), client)
        producer.produce(topic, b"before the fork", partition=0)
        receive, send = fork.Pipe(duplex=False)
        child = fork.Process(target=_send_in_child, args=(producer, topic, send))
        child.start()
        answer = receive.recv()
        child.join(60)
        producer.produce(topic, b"after the fork", partition=0)
        producer.close()
    assert child.exitcode == 0
    assert answer.startswith("refused: ") and "after the fork" in answer, answer
    records = read_topic(kafka.bootstrap, topic)
    assert [(r.value, r.pf.seq if r.pf else None) for r in records] == [
        (b"before the fork", 0),
        (b"after the fork", 1),
    ]
