"""Issue 13's "Done when" on real processes: an attacker writing to the raw topic between a
legitimate producer's records, with signing on.

Real ZooKeeper and Kafka, ``pidfence lease-server --signing-key`` (a key from ``pidfence keys
generate``), a ``pidfence produce`` process (``IdempotentProducer``), the attacker process
(``python -m pidfence.demo.attacker``) and ``pidfence sink --lease-public-key``. The producer
writes z0..z9, saves its checkpoint and stops itself (the ``--stop-after-checkpoint`` hook, so
nothing of it is in flight); the attacker reads the topic and writes FENCEs one generation ahead of
the live pid (without ``pfc``, with a ``pfc`` signed by its own key, not msgpack, of the wrong
length, and the pid's own real ``pfc``) and seq-0 records of fresh pids (without ``pfc`` and with
its own key's); the producer is woken and writes z10..z19 under the same pid and generation.
Judged: z0..z19 each in the output log once and in order, every forgery in the rejects log as
``FORGED`` at the offset the attacker's report gives, the sink's per-batch line counting the
``FORGED`` reasons, and the event-level checker clean. No sleeps order anything: the producer is
stopped by its own hook, the attacker runs to its exit while it is stopped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pidfence.demo.attacker import Forgery, read_report
from pidfence.demo.procs import ProducerRole, Worker, sink_argv
from pidfence.services.lease_server import spawn_lease_server
from pidfence.services.process import wait_until
from tests.chaos.conftest import ChaosKit

pytestmark = pytest.mark.timeout(420)

EVENTS = 20


def stopped(worker: Worker) -> bool:
    """True while the process is stopped (state ``T`` in /proc)."""
    stat = Path(f"/proc/{worker.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def keys(tmp: Path) -> tuple[Path, Path]:
    """``pidfence keys generate``: the lease signing key and its public key."""
    from pidfence.demo.procs import pidfence_argv

    done = subprocess.run(
        pidfence_argv("keys", "generate", str(tmp / "keys")),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tmp / "keys" / "lease-signing.key", tmp / "keys" / "lease-signing.pub"


def test_attacker_forgeries_are_forged_and_the_producer_appends_before_and_after(
    chaos: ChaosKit, kafka: Any, new_topic: Any, zk_chroot: str, stop_all: Any
) -> None:
    topic = new_topic(partitions=2)
    private, public = keys(chaos.tmp)
    lease = spawn_lease_server(zk_chroot, chaos.logs, "lease-signing", signing_key=private)
    stop_all(lease)

    # Part 1: z0..z9, checkpoint (everything acknowledged), then the producer stops itself.
    role: ProducerRole = chaos.role(
        "z",
        kafka.bootstrap,
        lease.address,
        topic,
        EVENTS,
        keys=8,
        checkpoint_every=10,
        extra=("--stop-after-checkpoint", "2"),
    )
    stop_all(role)
    producer = role.spawn()
    wait_until(lambda: not producer.running or stopped(producer), 120, "z to stop itself")
    assert producer.running, producer.tail()
    state = json.loads((chaos.tmp / "z.state.json").read_text())
    assert state["next_i"] == 10
    pid, generation = state["checkpoint"]["pid"], state["checkpoint"]["generation"]

    # The attack, while the producer is stopped.
    report = chaos.tmp / "forgeries.jsonl"
    attacker = Worker(
        "attacker",
        [
            sys.executable,
            "-m",
            "pidfence.demo.attacker",
            "--bootstrap",
            kafka.bootstrap,
            "--topic",
            topic,
            "--report",
            str(report),
        ],
        chaos.logs,
    ).start()
    stop_all(attacker)
    assert attacker.wait(120) == 0, attacker.tail()
    forged = read_report(report)
    kinds = Counter(f.kind for f in forged)
    fence_targets = {(f.pid, f.generation) for f in forged if f.kind.startswith("fence_")}
    assert fence_targets == {(pid, generation + 1)}, (fence_targets, pid, generation)
    # Every FENCE form on each partition z wrote; both fresh-pid forms on both partitions.
    z_partitions = len({f.partition for f in forged if f.kind == "fence_none"})
    assert z_partitions >= 1
    for kind in ("fence_none", "fence_foreign", "fence_garbage", "fence_short", "fence_stolen"):
        assert kinds[kind] == z_partitions, kinds
    assert kinds["fresh_none"] == kinds["fresh_foreign"] == 2, kinds

    # Part 2: the producer wakes and writes z10..z19 under the same pid and generation.
    producer.resume()
    assert producer.wait(120) == 0, producer.tail()
    after = json.loads((chaos.tmp / "z.state.json").read_text())["checkpoint"]
    assert (after["pid"], after["generation"]) == (pid, generation)

    sink = Worker(
        "sink",
        sink_argv(
            kafka.bootstrap,
            topic,
            chaos.tmp / "output",
            chaos.tmp / "checkpoint",
            ["--lease-public-key", str(public), "--master", "local[1]"],
        ),
        chaos.logs,
        env={"COLUMNS": "200"},
    ).start()
    stop_all(sink)
    assert sink.wait(300) == 0, sink.tail()
    console = (chaos.logs / "sink.log").read_text(errors="replace")

    outcome = chaos.outcome()
    outcome.assert_clean()
    assert_legit_once_in_order(outcome.log, pid)
    assert_every_forgery_forged(outcome.rejects, forged)
    # The legit producer's records around the forgeries were appended on the attacked partitions.
    for f in forged:
        if f.kind.startswith("fence_"):
            assert_appended_around(outcome.log, pid, f)
    # The sink's per-batch line counts FORGED by reason.
    reasons = Counter(f.reason for f in forged)
    line = next((ln for ln in console.splitlines() if "FORGED" in ln), "")
    match = re.search(r"FORGED (\d+) \(([^)]*)\)", line)
    assert match, console[-3000:]
    assert int(match.group(1)) == len(forged)
    counted = {
        name: int(n) for name, n in (part.rsplit(" ", 1) for part in match.group(2).split(", "))
    }
    assert counted == dict(reasons), (counted, reasons)

    # The same topic through a sink without --lease-public-key: the attack works, so the checks
    # above have teeth. The forged FENCEs fence z at its own generation (z10..z19 FENCED, lost)
    # and the fresh pids' records are appended.
    unverified = Worker(
        "sink-unverified",
        sink_argv(
            kafka.bootstrap,
            topic,
            chaos.tmp / "output-unverified",
            chaos.tmp / "checkpoint-unverified",
            ["--master", "local[1]"],
        ),
        chaos.logs,
    ).start()
    stop_all(unverified)
    assert unverified.wait(300) == 0, unverified.tail()
    from pidfence.spark_sink import read_log, read_rejects

    log = read_log(str(chaos.tmp / "output-unverified"))
    rejects = read_rejects(str(chaos.tmp / "output-unverified"))
    values = log.column("value").to_pylist()
    assert sum(1 for v in values if v.startswith(b"attack:")) == 4
    z = {json.loads(v)["i"] for v in values if not v.startswith(b"attack:")}
    attacked = {f.partition for f in forged if f.kind == "fence_none"}
    part2 = {
        json.loads(v)["i"]
        for p, v in zip(
            outcome.log.column("partition").to_pylist(),
            outcome.log.column("value").to_pylist(),
            strict=True,
        )
        if p in attacked and json.loads(v)["i"] >= 10
    }
    assert part2 and not part2 & z, (part2, z)  # z's later records there: fenced, lost
    assert Counter(rejects.column("verdict").to_pylist())["FENCED"] >= len(part2)


def assert_legit_once_in_order(log: Any, pid: int) -> None:
    """z0..z19 each once; per partition, in production order (ascending index and seq)."""
    rows = sorted(
        zip(
            log.column("partition").to_pylist(),
            log.column("log_offset").to_pylist(),
            log.column("pid").to_pylist(),
            log.column("seq").to_pylist(),
            [json.loads(v)["i"] for v in log.column("value").to_pylist()],
            strict=True,
        )
    )
    assert Counter(i for *_, i in rows) == Counter(range(EVENTS)), rows
    assert {row[2] for row in rows} == {pid}
    for partition in {row[0] for row in rows}:
        mine = [(seq, i) for p, _, _, seq, i in rows if p == partition]
        assert mine == sorted(mine) and [s for s, _ in mine] == list(range(len(mine))), mine


def assert_every_forgery_forged(rejects: Any, forged: list[Forgery]) -> None:
    verdict_at = {
        (p, o): v
        for p, o, v in zip(
            rejects.column("partition").to_pylist(),
            rejects.column("offset").to_pylist(),
            rejects.column("verdict").to_pylist(),
            strict=True,
        )
    }
    wrong = {
        (f.kind, f.partition, f.offset): verdict_at.get((f.partition, f.offset))
        for f in forged
        if verdict_at.get((f.partition, f.offset)) != "FORGED"
    }
    assert not wrong, wrong
    assert Counter(verdict_at.values())["FORGED"] == len(forged)


def assert_appended_around(log: Any, pid: int, forgery: Forgery) -> None:
    offsets = [
        o
        for p, i, o in zip(
            log.column("partition").to_pylist(),
            log.column("pid").to_pylist(),
            log.column("offset").to_pylist(),
            strict=True,
        )
        if p == forgery.partition and i == pid
    ]
    assert any(o < forgery.offset for o in offsets), (forgery, offsets)
    assert any(o > forgery.offset for o in offsets), (forgery, offsets)
