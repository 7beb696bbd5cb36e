"""``IdempotentProducer`` and ``pidfence produce`` against a real Kafka and a real lease server.

Every test reads what landed back from Kafka and, where it matters, replays the topic through the
broker rules (``pidfence.broker_plugin.ProducerStateTable``) in offset order, exactly as the sink
will.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pidfence.jars import classpath, java
from pidfence.ledger import read_ledger
from pidfence.pid_allocator import LeaseClient, LeaseServerThread, StaleGeneration
from pidfence.producer import (
    IdempotentProducer,
    LeaseState,
    ProducerFenced,
    key_partition,
    wall_clock_ms,
)
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.wire import FLAG_FENCE, Verdict
from tests.fixtures.commands import produce_args, state_count
from tests.fixtures.produced import (
    assert_gap_free,
    paused_after_save,
    producer_for,
    read_topic,
    replay,
    run_cli,
    woken,
)

Producing = Callable[[int], tuple[str, IdempotentProducer, LeaseClient]]


@pytest.fixture
def producing(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread
) -> Producing:
    """Callable(partitions) -> (a new topic, a fresh producer, its lease client): close both."""
    return lambda partitions: (new_topic(partitions=partitions), *producer_for(kafka, lease_server))


def send_round_robin(
    producer: IdempotentProducer, topic: str, prefix: str, indexes: range, partitions: int
) -> None:
    """Send ``<prefix><i>`` for each ``i`` of ``indexes`` to partition ``i % partitions``."""
    for i in indexes:
        producer.produce(topic, f"{prefix}{i}".encode(), partition=i % partitions)


def checkpoint_after(
    producer: IdempotentProducer, topic: str, count: int, partitions: int
) -> ProducerCheckpoint:
    """Send a0..a<count-1> round robin, wait until all are delivered, then checkpoint."""
    send_round_robin(producer, topic, "a", range(count), partitions)
    assert producer.flush(30) == 0
    return producer.checkpoint()


# ---- pidfence produce -----------------------------------------------------------------------


def test_produce_cli_writes_gap_free_sequences_from_zero(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    topic = new_topic(partitions=4)
    ledger = tmp_path / "ledger.jsonl"
    done = run_cli(
        *produce_args(kafka.bootstrap, lease_server.address, topic),
        "--count",
        "2000",
        "--keys",
        "100",
        "--ledger",
        str(ledger),
    )
    assert done.returncode == 0, done.stderr
    records = read_topic(kafka.bootstrap, topic)
    assert len(records) == 2000
    assert {r.pf.pid for r in records if r.pf} == {records[0].pf.pid if records[0].pf else -1}
    assert {r.partition for r in records} == {0, 1, 2, 3}
    assert all(r.pf is not None and r.pf.flags == 0 for r in records)
    assert_gap_free(records)
    for r in records:
        assert r.key is not None and r.partition == key_partition(r.key, 4)
    assert Counter(v for _, v in replay(records)) == {Verdict.APPENDED: 2000}
    acked = list(read_ledger([ledger]))
    assert sorted((e.partition, e.seq) for e in acked) == sorted(
        (r.partition, r.pf.seq) for r in records if r.pf
    )


JAVA_PRODUCER = """
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KeyedProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (int i = 2; i < args.length; i++) {
                byte[] key = args[i].getBytes("UTF-8");
                RecordMetadata meta =
                    producer.send(new ProducerRecord<>(args[1], key, key)).get();
                System.out.println(args[i] + " " + meta.partition());
            }
        }
    }
}
"""


def test_keyed_records_land_where_the_java_client_puts_them(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    ours, theirs = new_topic(partitions=7), new_topic(partitions=7)
    keys = [
        "21",
        "foobar",
        "abc",
        "",
        "k0",
        "k17",
        "user-42",
        "ümlaut",
        *[f"key{i}" for i in range(40)],
    ]
    producer, client = producer_for(kafka, lease_server)
    with client, producer:
        for key in keys:
            producer.produce(ours, b"v", key=key)
    landed = {
        r.key.decode(): r.partition for r in read_topic(kafka.bootstrap, ours) if r.key is not None
    }
    source = tmp_path / "KeyedProducer.java"
    source.write_text(JAVA_PRODUCER)
    # The empty key is an empty byte array in Java too (not null), so it is hashed.
    java_run = subprocess.run(
        [java(), "-cp", classpath("kafka"), str(source), kafka.bootstrap, theirs, *keys],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert java_run.returncode == 0, java_run.stderr[-3000:]
    java_partitions: dict[str, int] = {}
    for line in java_run.stdout.splitlines():
        key, _, partition = line.rpartition(" ")
        java_partitions[key] = int(partition)
    assert java_partitions == landed
    assert len(set(landed.values())) > 1


# ---- resume and fencing ---------------------------------------------------------------------


def test_resume_fences_a_zombie_that_keeps_writing(kafka: Any, producing: Producing) -> None:
    topic, zombie, client = producing(3)
    with client:
        checkpoint = checkpoint_after(zombie, topic, 30, 3)
        heir = IdempotentProducer.resume(checkpoint, client, zombie.config)
        assert heir.sequencer.pid == checkpoint.pid
        assert heir.sequencer.generation > checkpoint.generation
        # The zombie never learns of the takeover and keeps writing under its old generation.
        send_round_robin(zombie, topic, "a", range(30, 39), 3)
        zombie.close()
        send_round_robin(heir, topic, "b", range(9), 3)
        heir.close()
    verdicts = replay(read_topic(kafka.bootstrap, topic))
    by_value: dict[bytes | None, list[Verdict]] = {}
    fences = 0
    for record, verdict in verdicts:
        assert record.pf is not None
        if record.pf.flags & FLAG_FENCE:
            fences += 1
            assert verdict is Verdict.FENCE and record.value == b""
            continue
        by_value.setdefault(record.value, []).append(verdict)
        if (
            record.value is not None
            and record.value.startswith(b"a")
            and int(record.value[1:]) >= 30
        ):
            assert record.pf.generation == checkpoint.generation < heir.sequencer.generation
    assert fences == 3
    assert all(by_value[f"a{i}".encode()] == [Verdict.APPENDED] for i in range(30))
    assert all(by_value[f"a{i}".encode()] == [Verdict.FENCED] for i in range(30, 39))
    assert all(by_value[f"b{i}".encode()] == [Verdict.APPENDED] for i in range(9))


def test_paused_producer_process_is_fenced_by_its_resumed_replacement(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    """Process A is SIGSTOPped; B resumes A's checkpoint; A, continued, is FENCED everywhere,
    and stops at its next save (exit 3): it was replaced, so it stores nothing."""
    topic = new_topic(partitions=2)
    state_a, state_b = tmp_path / "a.json", tmp_path / "b.json"
    # Saves 100 records apart: A, paused just after one, writes on for a while when continued.
    common = produce_args(
        kafka.bootstrap, lease_server.address, topic, "--keys", "0", "--checkpoint-every", "100"
    )
    zombie_args = [*common, "--count", "1000000", "--rate", "400", "--state", str(state_a)]
    with paused_after_save(zombie_args, state_a, tmp_path / "zombie.err") as zombie:
        shutil.copyfile(state_a, state_b)
        taken_over_at = state_count(state_b, "next_i")
        heir = run_cli(
            *common,
            "--count",
            str(taken_over_at + 100),  # past all A sent before its pause (< 100 past a save)
            "--rate",
            "400",  # a resume must repeat the options that shaped its records
            "--state",
            str(state_b),
        )
        assert heir.returncode == 0, heir.stderr
        # Let the zombie write on: every record it sends now carries the fenced generation,
        # until its next save asks the lease server and learns it was replaced.
        saved = state_count(state_a, "next_i")
        woken(zombie)
    told = (tmp_path / "zombie.err").read_text()
    assert zombie.returncode == 3 and "ProducerFenced" in told and "replaced" in told, told
    # Its refused save stored nothing (a save it had confirmed before its pause may land).
    assert state_count(state_a, "next_i") in (saved, saved + 100)
    verdicts = replay(read_topic(kafka.bootstrap, topic))
    fence_at = {r.partition: r.offset for r, v in verdicts if v is Verdict.FENCE}
    heir_generation = max(r.pf.generation for r, _ in verdicts if r.pf)
    assert sorted(fence_at) == [0, 1]
    late_zombie = [
        (r, v)
        for r, v in verdicts
        if r.offset > fence_at[r.partition] and r.pf and r.pf.generation < heir_generation
    ]
    assert len(late_zombie) >= 20
    assert {v for _, v in late_zombie} == {Verdict.FENCED}
    # The appended log is records 0 .. taken_over_at+99 of the load, each exactly once.
    appended = [json.loads(r.value or b"{}")["i"] for r, v in verdicts if v is Verdict.APPENDED]
    assert sorted(appended) == list(range(taken_over_at + 100))


def test_resume_of_an_expired_checkpoint_rolls_it_into_its_successor(
    kafka: Any,
    new_topic: Callable[..., str],
    lease_server: LeaseServerThread,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = new_topic(partitions=1)
    # A checkpoint taken the way a caller stores it, resumed once its lease ended.
    producer, client = producer_for(kafka, lease_server)
    with client:
        producer.produce(topic, b"y")
        assert producer.flush(30) == 0
        checkpoint = producer.checkpoint()
        producer.close()
        later = checkpoint.expire_ms + 1
        with caplog.at_level(logging.INFO, logger="pidfence.producer"):
            resumed = IdempotentProducer.resume(
                checkpoint, client, producer.config, clock=lambda: later
            )
        assert resumed.resumed_how == "rolled" and resumed.resumed_from_expired
        assert resumed.sequencer.pid != checkpoint.pid
        assert resumed.sequencer.checkpoint().next_seq == {}
        assert any("(rolled)" in r.getMessage() for r in caplog.records)
        # The pid was retired by the roll: the old owner can neither bump nor roll it any more.
        with pytest.raises(StaleGeneration) as stale:
            client.roll(checkpoint.pid, checkpoint.generation, checkpoint.secret)
        assert stale.value.successor == resumed.sequencer.pid
        resumed.produce(topic, b"z")
        resumed.close()
    records = read_topic(kafka.bootstrap, topic)
    assert [r.value for r in records] == [b"y", b"z"]
    assert records[-1].pf is not None and records[-1].pf.seq == 0
    assert not any(r.pf and r.pf.flags & FLAG_FENCE for r in records)


def test_rollover_leases_a_new_pid_with_seqs_from_zero(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread
) -> None:
    topic = new_topic(partitions=2)
    offset = [0]
    producer, client = producer_for(kafka, lease_server, clock=lambda: wall_clock_ms() + offset[0])
    with client:
        first_pid = producer.sequencer.pid
        lifetime = producer.sequencer.expire_ms - wall_clock_ms()
        send_round_robin(producer, topic, "a", range(10), 2)
        # 23/24 of the lifetime has passed: the next record goes out under a new pid (after the
        # old pid's records are drained). The successor's lease is issued on the server's clock,
        # so the producer's clock goes back to it right after the roll.
        offset[0] = lifetime * 23 // 24 + 1000
        for i in range(10):
            producer.produce(topic, f"b{i}".encode(), partition=i % 2)
            offset[0] = 0
        assert producer.rollovers == 1
        assert producer.sequencer.pid != first_pid
        producer.close()
    records = read_topic(kafka.bootstrap, topic)
    assert_gap_free(records)
    assert {r.pf.pid for r in records if r.pf} == {first_pid, producer.sequencer.pid}
    assert Counter(v for _, v in replay(records)) == {Verdict.APPENDED: 20}


def test_resume_after_a_bump_that_wrote_no_fence_is_accepted_by_the_broker_rules(
    kafka: Any, producing: Producing
) -> None:
    """A predecessor bumped, then died before its FENCEs: the heir walks the generation up."""
    topic, first, client = producing(2)
    with client:
        checkpoint = checkpoint_after(first, topic, 6, 2)
        first.close()
        # the dead predecessor's bump
        client.bump(checkpoint.pid, checkpoint.generation, checkpoint.secret)
        heir = IdempotentProducer.resume(checkpoint, client, first.config)
        assert heir.sequencer.generation == checkpoint.generation + 2
        send_round_robin(heir, topic, "b", range(4), 2)
        heir.close()
    verdicts = replay(read_topic(kafka.bootstrap, topic))
    assert Counter(v for _, v in verdicts) == {Verdict.APPENDED: 10, Verdict.FENCE: 4}


# A replaced producer stores nothing: ``checkpoint()`` asks the lease authority whether a resume
# of its checkpoint moved the pid on, so a zombie's periodic save cannot overwrite its
# replacement's state with a position the sink never appended.


@pytest.mark.timeout(240)
def test_a_replaced_producer_cannot_checkpoint(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread
) -> None:
    topic = new_topic(partitions=2)
    zombie, client = producer_for(kafka, lease_server)
    with client:
        for i in range(10):
            zombie.produce(topic, b"a%d" % i, partition=i % 2)
        assert zombie.flush(30) == 0
        checkpoint = zombie.checkpoint()  # the owner's: confirmed
        heir = IdempotentProducer.resume(checkpoint, client, zombie.config)
        for i in range(10, 14):
            zombie.produce(topic, b"a%d" % i, partition=i % 2)  # FENCED: the heir bumped
        assert zombie.flush(30) == 0
        with pytest.raises(ProducerFenced, match="was replaced"):
            zombie.checkpoint()
        assert zombie.state is LeaseState.FENCED
        zombie.close()
        assert heir.checkpoint().generation > checkpoint.generation
        heir.close()
    verdicts = Counter(v for r, v in replay(read_topic(kafka.bootstrap, topic)) if r.value)
    assert verdicts == {Verdict.APPENDED: 10, Verdict.FENCED: 4}


@pytest.mark.timeout(240)
def test_a_paused_produce_stops_at_its_next_save_instead_of_overwriting_its_replacements(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    """The review's case with ``pidfence produce`` and ONE state file: A saves and is paused
    (SIGSTOP); B resumes that file, writes 5 records, saves and ends; A is continued, writes on
    under its fenced generation and comes to its next save. Storing it would put the file past
    records the sink FENCED (B never wrote them), and C's resume from it would skip them. A
    stops there instead (exit 3, "replaced"), and C continues the file: every record is
    appended exactly once. (A paused between its question and its write finishes that one
    save when continued: confirmed before B's resume, it is true, as every record it covers
    was acknowledged before B's FENCE.)"""
    topic = new_topic(partitions=2)
    state = tmp_path / "p.json"
    common = produce_args(
        kafka.bootstrap, lease_server.address, topic, "--keys", "0", "--checkpoint-every", "20"
    )
    shaped = ("--rate", "400", "--state", str(state))
    zombie_err = tmp_path / "zombie.err"
    with paused_after_save([*common, "--count", "1000000", *shaped], state, zombie_err) as zombie:
        paused_at = state_count(state, "next_i")
        heir = run_cli(*common, "--count", str(paused_at + 5), *shaped)
        assert heir.returncode == 0, heir.stderr
        assert state_count(state, "next_i") == paused_at + 5
        woken(zombie)
    assert zombie.returncode == 3, zombie_err.read_text()
    assert "ProducerFenced" in zombie_err.read_text() and "replaced" in zombie_err.read_text()
    # B's save stands, or the one A had confirmed before its pause (a save is 20 records).
    assert state_count(state, "next_i") in (paused_at + 5, paused_at + 20)
    total = paused_at + 60
    last = run_cli(*common, "--count", str(total), *shaped)
    assert last.returncode == 0, last.stderr
    verdicts = replay(read_topic(kafka.bootstrap, topic))
    appended = [json.loads(r.value or b"{}")["i"] for r, v in verdicts if v is Verdict.APPENDED]
    assert sorted(appended) == list(range(total))
