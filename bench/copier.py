"""``pidfence bench copier``: copier group throughput with 1, 2 and 3 members, and takeover time.

One ZooKeeper, one Kafka broker and one lease server are started for the run. The input topic
has ``PARTITIONS`` partitions (6: an even share for 1, 2 and 3 members) filled with 100-byte
values, the same number per partition, a multiple of ``--checkpoint-every``.

* **Throughput**: ``pidfence copy --group G`` members (processes, no ledger) copy the whole topic
  to a new output topic; the group's committed offsets (read with ``OffsetFetch``, as any
  monitor would) say when every record is copied and committed. Reported over the whole run
  (process start, group join, task opening included) and over the steady part (from the first
  commit past an opening commit).
* **Takeover**: two members copy while a producer writes 1,000 records/s; one is SIGKILLed
  (then, in a second run, stopped with SIGTERM, which hands its partitions over with a commit).
  For every partition, the first output record stamped (CreateTime) at or after the stop is the
  first one its new owner copied (the stopped member sends nothing more); the takeover time is
  the longest of those waits: the session timeout, the rebalance, the resume (bump, FENCE,
  recovery scan) and the first copy.

``PIDFENCE_BENCH_RECORDS`` overrides the records per partition (the smoke test).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
from rich.progress import Progress

from pidfence.benchkit import BenchReport
from pidfence.demo.copier_group import CopierGroup, wait_all
from pidfence.pid_allocator import LeaseServerThread
from pidfence.services import KafkaCluster, ZooKeeperEnsemble, create_topic, new_chroot

PARTITIONS = 6
VALUE_SIZE = 100
CHECKPOINT_EVERY = 500
SESSION_S = 10
RATE = 1000.0
RECORDS_ENV = "PIDFENCE_BENCH_RECORDS"
#: The longest a wait for the group's commits may take (the full run's copy takes ~30 s).
WAIT_S = 600.0
MEMBER_ARGS = (
    "--idle-exit",
    "3",
    "--checkpoint-every",
    str(CHECKPOINT_EVERY),
    "--session-timeout",
    str(SESSION_S),
    "--message-timeout",
    "5s",
)


def _fill(bootstrap: str, topic: str, per_partition: int) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5}
    )
    value = b"v" * VALUE_SIZE
    for i in range(per_partition * PARTITIONS):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60) != 0:
        raise RuntimeError("the input was not acknowledged")


class Commits:
    """Reads a group's committed offsets of the input topic, as any monitor would."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self._reader = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self._parts = [confluent_kafka.TopicPartition(topic, p) for p in range(PARTITIONS)]

    def copied(self) -> int:
        """Input records the group has committed as copied (0 while its coordinator loads)."""
        try:
            return sum(max(tp.offset, 0) for tp in self._reader.committed(self._parts, 10))
        except confluent_kafka.KafkaException:
            return 0

    def close(self) -> None:
        """Close the reader."""
        self._reader.close()


def still_copying(group: Any, members: list[str], copied: int, due: int, deadline: float) -> None:
    """Raise unless every one of ``members`` (each member's current instance) still runs and
    ``deadline`` (monotonic) has not passed, ``copied`` of ``due`` records committed so far."""
    if ended := [m for m in members if not group.current(m).running]:
        tails = "\n".join(group.current(m).tail(8) for m in ended)
        raise RuntimeError(
            f"member {', '.join(ended)} ended at {copied} of {due} committed:\n{tails}"
        )
    if time.monotonic() > deadline:
        raise RuntimeError(
            f"{copied} of {due} records committed after {WAIT_S:g} s: the group hangs"
        )


def wait_committed(commits: Commits, group: Any, members: list[str], due: int) -> None:
    """Wait until the group has committed ``due`` input records, ``members`` running all along."""
    deadline = time.monotonic() + WAIT_S
    while (copied := commits.copied()) < due:
        still_copying(group, members, copied, due, deadline)
        time.sleep(0.2)


def _throughput(
    bootstrap: str, lease: str, source: str, total: int, members: int, folder: Path
) -> dict[str, Any]:
    target = create_topic(bootstrap, f"copy-{uuid.uuid4().hex[:8]}", PARTITIONS)
    group = CopierGroup(
        bootstrap, lease, source, target, f"bench-{target}", folder, MEMBER_ARGS, ledgers=False
    )
    commits = Commits(bootstrap, group.group, source)
    started = time.monotonic()
    deadline = started + WAIT_S
    first = done = 0.0
    base = 0
    try:
        for i in range(members):
            group.start(f"m{i}")
        while True:
            running = group.running()
            copied, now = commits.copied(), time.monotonic()
            if copied and not first:
                first, base = now, copied
            if copied >= total:
                done = now
                break
            if not running:
                tails = "\n".join(w.tail(8) for w in group.workers)
                raise RuntimeError(f"members ended at {copied} of {total} committed:\n{tails}")
            if now > deadline:
                raise RuntimeError(f"{copied} of {total} committed after {WAIT_S:g} s: hangs")
            time.sleep(0.1)
        codes = wait_all(group, 120)
    finally:
        commits.close()
        group.stop()
    if any(codes.values()):
        raise RuntimeError(f"member exits {codes}")
    return {
        "contender": f"{members} member{'s' if members > 1 else ''}",
        "records": total,
        "seconds": round(done - started, 2),
        "msgs_per_s": total / (done - started),
        "msgs_per_s_steady": (total - base) / max(done - first, 1e-3),
    }


def _writer(bootstrap: str, topic: str, stop: threading.Event) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    value, i, started = b"w" * VALUE_SIZE, 0, time.monotonic()
    while not stop.is_set():
        producer.produce(topic, value, partition=i % PARTITIONS)
        i += 1
        time.sleep(max(0.0, started + i / RATE - time.monotonic()))
        producer.poll(0)
    producer.flush(30)


def _first_after(bootstrap: str, topic: str, since_ms: int) -> dict[int, int]:
    """Per partition, the CreateTime of the first data record stamped at or after ``since_ms``
    (read as they arrive, until every partition has one)."""
    reader = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}"}
    )
    try:
        found: dict[int, int] = {}
        times = [confluent_kafka.TopicPartition(topic, p, since_ms) for p in range(PARTITIONS)]
        reader.assign(reader.offsets_for_times(times, timeout=10))
        deadline = time.monotonic() + SESSION_S + 60
        while len(found) < PARTITIONS and time.monotonic() < deadline:
            msg = reader.poll(1.0)
            if msg is None or msg.error() is not None or not msg.value():
                continue  # nothing yet, or a FENCE (empty value)
            stamp, partition = msg.timestamp()[1], msg.partition()
            if partition is not None and stamp >= since_ms:
                found.setdefault(partition, stamp)
        return found
    finally:
        reader.close()


def _takeover(bootstrap: str, lease: str, folder: Path, how: str) -> dict[str, Any]:
    source = create_topic(bootstrap, f"live-{uuid.uuid4().hex[:8]}", PARTITIONS)
    target = create_topic(bootstrap, f"copy-{uuid.uuid4().hex[:8]}", PARTITIONS)
    extra = (*MEMBER_ARGS[:1], "60", *MEMBER_ARGS[2:])  # idle exit after the writer stops
    group = CopierGroup(
        bootstrap, lease, source, target, f"bench-{target}", folder, extra, ledgers=False
    )
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(bootstrap, source, stop), daemon=True)
    writer.start()
    commits = Commits(bootstrap, group.group, source)
    try:
        group.start("a")
        group.start("b")
        wait_committed(commits, group, ["a", "b"], 4 * CHECKPOINT_EVERY)
        time.sleep(3.0)  # both members copying in a settled group
        stopped_ms = time.time_ns() // 1_000_000
        if how == "kill":
            group.current("a").kill()
        else:
            group.current("a").proc.terminate()
        first = _first_after(bootstrap, target, stopped_ms)
    finally:
        commits.close()
        stop.set()
        writer.join(30)
        group.stop()
    waits = {p: (stamp - stopped_ms) / 1000 for p, stamp in sorted(first.items())}
    if len(waits) < PARTITIONS:
        raise RuntimeError(f"partitions never copied after the stop: {waits}")
    return {
        "contender": f"takeover after {'SIGKILL' if how == 'kill' else 'SIGTERM (leave)'}",
        "takeover_s": max(waits.values()),
        "per_partition_s": waits,
    }


def run(quick: bool, progress: Progress) -> BenchReport:
    """Measure copy throughput with 1, 2 and 3 members, then the takeover times."""
    per_partition = int(
        os.environ.get(RECORDS_ENV) or (2 * CHECKPOINT_EVERY if quick else 20 * CHECKPOINT_EVERY)
    )
    total = per_partition * PARTITIONS
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    task = progress.add_task("copy bench", total=5)
    with (
        tempfile.TemporaryDirectory(prefix="bench-copy-") as tmp,
        ZooKeeperEnsemble(1) as zk,
        KafkaCluster(1) as kafka,
    ):
        lease = LeaseServerThread(new_chroot(zk.hosts, "/bench-copy")).start()
        try:
            bootstrap, folder = kafka.bootstrap, Path(tmp)
            source = create_topic(bootstrap, f"in-{uuid.uuid4().hex[:8]}", PARTITIONS)
            _fill(bootstrap, source, per_partition)
            for members in (1, 2, 3):
                progress.update(task, description=f"copy bench: {members} member(s)")
                rows.append(_throughput(bootstrap, lease.address, source, total, members, folder))
                progress.advance(task)
            for how in ("kill", "leave"):
                progress.update(task, description=f"copy bench: takeover ({how})")
                rows.append(_takeover(bootstrap, lease.address, folder, how))
                progress.advance(task)
        finally:
            lease.stop()
    one = rows[0]["msgs_per_s"]
    for row in rows[:3]:
        row["ratio_to_1_member"] = row["msgs_per_s"] / one
    return BenchReport(
        title="pidfence copy --group: throughput and takeover",
        columns=[
            "contender",
            "records",
            "seconds",
            "msgs_per_s",
            "msgs_per_s_steady",
            "ratio_to_1_member",
            "takeover_s",
        ],
        rows=rows,
        notes=[
            f"{PARTITIONS} partitions, {VALUE_SIZE}-byte values, --checkpoint-every "
            f"{CHECKPOINT_EVERY}, --session-timeout {SESSION_S}; members are processes on "
            f"this machine ({os.cpu_count()} CPUs) beside Kafka and ZooKeeper",
            f"load average before {load_before}, after {os.getloadavg()}",
        ],
        params={"per_partition": per_partition, "partitions": PARTITIONS, "rate": RATE},
    )
