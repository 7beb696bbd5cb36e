"""``pidfence copy`` killed with SIGKILL at several moments and restarted: exact output after dedup.

Until the sink exists, the output topic is replayed through the broker rules
(``pidfence.broker_plugin``) in offset order: what they append must be exactly the input's values,
each once, in order per partition.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka

from pidfence.pid_allocator import LeaseServerThread
from pidfence.wire import FLAG_FENCE, Verdict
from tests.fixtures.commands import state_count
from tests.fixtures.produced import PIDFENCE, read_topic, replay

PARTITIONS = 3
PER_PARTITION = 4000


def copy_command(
    kafka: Any, lease_server: LeaseServerThread, source: str, target: str, state: Path
) -> list[str]:
    """``pidfence copy`` of ``source`` to ``target`` with a state file, ending 3 s idle."""
    return [
        *(PIDFENCE, "copy", "--bootstrap", kafka.bootstrap),
        *("--lease-server", lease_server.address, "--from-topic", source, "--to-topic", target),
        *("--state", str(state), "--idle-exit", "3"),
    ]


def _fill(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    """Write the input with a plain producer; returns the values per partition in order."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True}
    )
    values: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for i in range(PER_PARTITION):
        for p in range(PARTITIONS):
            value = f"p{p}-r{i}".encode()
            values[p].append(value)
            while True:
                try:
                    producer.produce(topic, value, partition=p, headers=[("src", b"A")])
                    break
                except BufferError:
                    producer.poll(0.1)
    assert producer.flush(60) == 0
    return values


def test_copier_killed_at_any_moment_copies_each_record_exactly_once(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    source, target = new_topic(partitions=PARTITIONS), new_topic(partitions=PARTITIONS)
    sent = _fill(kafka.bootstrap, source)
    # "The values of A" are what A's log holds, in offset order.
    expected: dict[int, list[bytes | None]] = {p: [] for p in range(PARTITIONS)}
    for record in read_topic(kafka.bootstrap, source):
        expected[record.partition].append(record.value)
    assert expected == sent
    total = PARTITIONS * PER_PARTITION
    state = tmp_path / "copy-state.json"
    command = [
        *copy_command(kafka, lease_server, source, target, state),
        "--checkpoint-every",
        "50",
    ]
    # Kill moments, as "copied" in the state file: right after the first save (the fresh lease,
    # nothing sent yet), then mid-run at several points; the last run copies to the end.
    kill_when = [0, total // 5, total // 2, (3 * total) // 4]
    kills = 0
    for threshold in kill_when:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            while state_count(state, "copied") < threshold and process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(0.01)
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                kills += 1
            process.wait(30)
            if process.returncode not in (0, -signal.SIGKILL):
                raise AssertionError(process.stderr.read() if process.stderr else "")
        finally:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(30)
            if process.stderr is not None:
                process.stderr.close()
    final = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert final.returncode == 0, final.stderr
    assert state_count(state, "copied") == total
    assert kills >= 1

    verdicts = replay(read_topic(kafka.bootstrap, target))
    appended: dict[int, list[bytes | None]] = {p: [] for p in range(PARTITIONS)}
    for record, verdict in verdicts:
        if verdict is Verdict.APPENDED:
            appended[record.partition].append(record.value)
    for p in range(PARTITIONS):
        if appended[p] != expected[p]:
            got = Counter(appended[p])
            missing = [v for v in expected[p] if v not in got][:10]
            twice = [v for v, n in got.items() if n > 1][:10]
            pairs = enumerate(zip(appended[p], expected[p], strict=False))
            first_diff = next((i for i, (a, b) in pairs if a != b), None)
            detail = [
                (r.offset, r.value, r.pf, v.name)
                for r, v in verdicts
                if r.partition == p and v is not Verdict.APPENDED
            ][:40]
            raise AssertionError(
                f"partition {p}: {len(appended[p])} appended, {len(expected[p])} expected; "
                f"missing {missing}; twice {twice}; first difference at {first_diff}; "
                f"verdicts {Counter(v for r, v in verdicts if r.partition == p)}; "
                f"non-appended {detail}"
            )
    counts = Counter(v for _, v in verdicts)
    # Every verdict other than APPENDED is a re-send (DUPLICATE), a FENCE record, or a record a
    # killed incarnation sent under a generation its successor had already fenced.
    assert set(counts) <= {Verdict.APPENDED, Verdict.DUPLICATE, Verdict.FENCE, Verdict.FENCED}
    assert all((v is Verdict.FENCE) == bool(r.pf and r.pf.flags & FLAG_FENCE) for r, v in verdicts)


def test_copier_rolls_over_mid_run_and_stores_the_successor_with_its_offsets(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    """The copier's rollover: drain, ``roll`` through the lease server, store the offsets with
    the successor's checkpoint; a restart then resumes the successor and the output is exact."""
    from pidfence.pid_allocator import LeaseClient
    from pidfence.producer import ProducerConfig, wall_clock_ms
    from pidfence.producer.copier import Copier, CopySpec
    from pidfence.producer.opening import open_producer_factory
    from tests.fixtures.lease import LEASE_TEST_DEFAULTS

    source, target = new_topic(partitions=PARTITIONS), new_topic(partitions=PARTITIONS)
    sent = _fill(kafka.bootstrap, source)
    total = PARTITIONS * PER_PARTITION
    state = tmp_path / "copy-state.json"
    # Half way through, the producer's clock jumps past the rollover point; it goes back to the
    # lease server's clock once the successor's checkpoint is stored (its lease is issued on it).
    jump = [0]
    config = ProducerConfig(kafka.bootstrap)
    stored: list[dict[str, Any]] = []

    class RollingCopier(Copier):
        def _store(self, checkpoint: Any, offsets: dict[int, int], copied: int) -> None:
            if jump[0] and not checkpoint.next_seq:
                jump[0] = 0
            super()._store(checkpoint, offsets, copied)

    def progress(copied: int) -> None:
        stored.append(json.loads(state.read_text())["checkpoint"])
        if copied >= total // 2 and not stored[0].get("jumped"):
            stored[0]["jumped"] = True
            jump[0] = LEASE_TEST_DEFAULTS["lifetime_ms"] * 23 // 24 + 1000

    spec = CopySpec(kafka.bootstrap, source, target, checkpoint_every=50, idle_exit_s=3)
    with LeaseClient(lease_server.address) as client:
        opener = open_producer_factory(config, client, clock=lambda: wall_clock_ms() + jump[0])
        first = RollingCopier(spec, opener, state).run(progress)
        assert first.copied == total
        pids = [cp["pid"] for cp in stored]
        assert len(set(pids)) == 2, "exactly one rollover"
        successor = pids[-1]
        # The successor's first stored checkpoint already names it with seqs from 0 at the
        # roll point (offsets unchanged), before any record went out under it.
        at_roll = next(cp for cp in stored if cp["pid"] == successor)
        assert all(seq <= 50 for _, _, seq in at_roll["next_seq"])
        jump[0] = 0
        again = Copier(spec, open_producer_factory(config, client), state).run()
        assert again.resumed and again.copied == total
    verdicts = replay(read_topic(kafka.bootstrap, target))
    appended: dict[int, list[bytes | None]] = {p: [] for p in range(PARTITIONS)}
    for record, verdict in verdicts:
        if verdict is Verdict.APPENDED:
            appended[record.partition].append(record.value)
    assert appended == sent


def test_input_deleted_before_it_was_copied_is_refused_then_skipped_when_allowed(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    """Retention deletes input records a stopped copier had not copied yet: the rerun refuses
    (exit 3) naming the offsets, where Kafka's consumer would jump to the log start without a
    word; ``--allow-data-loss`` continues after them, and everything else is copied once."""
    from tests.integration.test_gaps import delete_records_before

    source, target = new_topic(partitions=1), new_topic(partitions=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    sent = [f"r{i}".encode() for i in range(100)]
    for value in sent:
        producer.produce(source, value, partition=0)
    assert producer.flush(60) == 0
    state = tmp_path / "copy-state.json"
    command = copy_command(kafka, lease_server, source, target, state)

    def copy(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *extra], capture_output=True, text=True, timeout=300, check=False
        )

    first = copy("--max-records", "40")
    assert first.returncode == 0, first.stderr
    delete_records_before(kafka.bootstrap, source, 70)
    refused = copy()
    assert refused.returncode == 3, refused.stderr
    assert "Kafka deleted offsets 40..69" in refused.stderr, refused.stderr
    assert "--allow-data-loss" in refused.stderr
    allowed = copy("--allow-data-loss")
    assert allowed.returncode == 0, allowed.stderr
    assert "continuing at offset 70" in allowed.stderr, allowed.stderr
    verdicts = replay(read_topic(kafka.bootstrap, target))
    appended = [r.value for r, v in verdicts if v is Verdict.APPENDED]
    assert appended == sent[:40] + sent[70:]
