"""Issue 35 on real Kafka, Spark and a lease server, as an operator meets it.

Each case writes ``pf`` headers exactly as a producer writes them (pids, generations and leases
from the real lease server) and runs ``pidfence sink`` with its default settings plus
``--lease-server``; then ``pidfence verify`` judges the output against a ledger of what Kafka
acknowledged. In every case each event is in the output exactly once or, where no rule can prove
it, named in the rejects; no zombie's record and no re-send of an ended lease is appended.

1. a librdkafka timeout hole (seqs 2 and 3 never written), then the resume's re-sends;
2. a zombie beyond a trimmed head, interleaved with its successor, in one sink run and across two;
3. a pid whose entry expired while the sink ran, met again beyond a horizon;
4. settling held records after a generation move, with a zombie's record that reached the log
   after the newer generation's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from pidfence.cli.exits import EXIT_ANOMALIES, EXIT_OK
from pidfence.ledger import LedgerEntry, LedgerWriter, value_digest
from pidfence.pid_allocator import LeaseClient
from pidfence.spark_sink import read_gaps, read_log, read_rejects
from pidfence.testing.mutations import MUTATIONS
from pidfence.wire import FLAG_FENCE, encode_pf
from tests.fixtures.commands import run_pidfence
from tests.integration.test_cli_sink import run_sink
from tests.integration.test_gaps import delete_records_before

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

#: (partition, label, pid, generation, seq, flags): one crafted record.
Crafted = tuple[int, str, int, int, int, int]


class Writer:
    """Writes crafted records through a librdkafka producer and keeps what Kafka acknowledged
    as a send ledger (the producer's own, had it written them)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.raw = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.acked: list[LedgerEntry] = []

    def write(self, records: Iterable[Crafted], ts_ms: int | None = None) -> None:
        for partition, label, pid, gen, seq, flags in records:
            fence = bool(flags & FLAG_FENCE)
            value = b"" if fence else label.encode()

            def acked(
                err: Any,
                msg: Any,
                pid: int = pid,
                gen: int = gen,
                seq: int = seq,
                fence: bool = fence,
            ) -> None:
                assert err is None, err
                self.acked.append(
                    LedgerEntry(
                        pid,
                        gen,
                        self.topic,
                        msg.partition(),
                        seq,
                        value_digest(msg.value()),
                        msg.offset(),
                        msg.timestamp()[1],
                        fence,
                        event=msg.value().decode(),
                    )
                )

            self.raw.produce(
                self.topic,
                value=value,
                partition=partition,
                headers=[("pf", encode_pf(pid, gen, seq, flags))],
                on_delivery=acked,
                timestamp=ts_ms or 0,  # 0: librdkafka stamps it now
            )
            self.raw.flush(30)  # one at a time: the log's order is the order written

    def ledger(self, path: Path, keep: Iterable[str] | None = None) -> Path:
        """The acknowledged records (only the events in ``keep`` when given) as a ledger."""
        wanted = None if keep is None else set(keep)
        with LedgerWriter(path) as ledger:
            for entry in self.acked:
                if wanted is None or entry.event in wanted:
                    ledger.write(entry)
        return path


def sink(bootstrap: str, topic: str, tmp_path: Path, lease: str, *more: str) -> str:
    """``pidfence sink --available-now --lease-server LEASE``; returns its stdout."""
    result, _ = run_sink(
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--output",
        str(tmp_path / "out"),
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--available-now",
        "--lease-server",
        lease,
        *more,
        timeout=420,
    )
    assert result.returncode == EXIT_OK, result.stderr + result.stdout
    assert "adoption is off" not in result.stderr
    return result.stdout


def part(table: pa.Table, partition: int) -> list[dict[str, Any]]:
    rows = table.filter(pa.compute.equal(table["partition"], partition)).to_pylist()
    by = "offset" if "verdict" in table.column_names else "log_offset"
    return sorted(rows, key=lambda r: r[by])


def labels(rows: list[dict[str, Any]]) -> list[str]:
    return [r["value"].decode() for r in rows]


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {r["value"].decode() or f"fence@{r['offset']}": r["verdict"] for r in rows}


def gaps_of(output: Path, partition: int) -> list[tuple[Any, ...]]:
    rows = read_gaps(str(output)).to_pylist()
    return [
        (r["kind"], r["seq_first"], r["seq_last"])
        for r in rows
        if r["partition"] == partition and r["kind"] != "offsets"
    ]


def verify(ledger: Path, output: Path) -> dict[str, Any]:
    import json

    result = run_pidfence(
        "verify", "--ledger", str(ledger), "--output", str(output), "--json", timeout=300
    )
    assert result.returncode in (EXIT_OK, EXIT_ANOMALIES), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def bumped_lease(client: LeaseClient) -> tuple[int, int, int]:
    """A new lease and its first bump: the pid, its first generation and the bumped one."""
    lease = client.lease()
    return (
        lease.pid,
        lease.generation,
        client.bump(lease.pid, lease.generation, lease.secret).generation,
    )


def fenced_and_trimmed(
    w: Writer, client: LeaseClient, partition: int, label: str
) -> tuple[int, int, int]:
    """Case 2's start on ``partition``: g1 wrote ``label`` 0..9, its successor g2 FENCEd at 10,
    and retention deleted all of it. The pid, g1 and g2."""
    pid, g1, g2 = bumped_lease(client)
    w.write([(partition, f"{label}{s}", pid, g1, s, 0) for s in range(10)])
    w.write([(partition, "", pid, g2, 10, FLAG_FENCE)])
    delete_records_before(w.bootstrap, w.topic, 11, partition=partition)
    return pid, g1, g2


def test_cases_1_2_and_4_each_event_once_through_the_lease_server(
    kafka: Any, new_topic: Any, lease_server: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=4)
    out = tmp_path / "out"
    client = LeaseClient(lease_server.address)
    w = Writer(kafka.bootstrap, topic)

    # Case 1 (partition 0): g1 writes e0, e1, e4..e10 (e2, e3 timed out in librdkafka's
    # queue); the resume bumps to g2, FENCEs at seq 2 and re-sends e2..e12.
    a, g1, g2 = bumped_lease(client)
    w.write([(0, f"a{s}", a, g1, s, 0) for s in (0, 1, *range(4, 11))])
    w.write([(0, "", a, g2, 2, FLAG_FENCE)])
    w.write([(0, f"a{s}", a, g2, s, 0) for s in range(2, 13)])

    # Case 2 (partition 1): then the zombie (g1) and the successor (g2) interleave.
    b, bg1, bg2 = fenced_and_trimmed(w, client, 1, "b")
    interleaved = [(bg1, 10), (bg2, 10), (bg1, 11), (bg2, 11), (bg2, 12), (bg1, 12), (bg2, 13)]
    w.write([(1, f"{'z' if g == bg1 else 'b'}{s}", b, g, s, 0) for g, s in interleaved])

    # Case 2 across two runs (partition 3): the zombie's records in this run, the successor's in
    # the next.
    c, cg1, cg2 = fenced_and_trimmed(w, client, 3, "c")
    w.write([(3, f"y{s}", c, cg1, s, 0) for s in (10, 11, 12)])

    # Case 4 (partition 2): g1 writes 0, 1, 3 (2 missing); g2's 5 arrives, then g1's 4 (after
    # it: a zombie's), then g2 FENCEs at 2 and re-sends 2, 3, 4.
    d, dg1, dg2 = bumped_lease(client)
    w.write([(2, f"d{s}", d, dg1, s, 0) for s in (0, 1, 3)])
    w.write([(2, "d5", d, dg2, 5, 0), (2, "x4", d, dg1, 4, 0)])
    w.write([(2, "", d, dg2, 2, FLAG_FENCE)])
    w.write([(2, f"d{s}", d, dg2, s, 0) for s in (2, 3, 4)])

    sink(kafka.bootstrap, topic, tmp_path, lease_server.address)
    log, rejects = read_log(str(out)), read_rejects(str(out))
    # Run 1 of the two-run case: the zombie's records are neither appended nor final yet.
    assert labels(part(log, 3)) == []
    assert part(rejects, 3) == []

    w.write([(3, f"c{s}", c, cg2, s, 0) for s in (10, 11, 12, 13)])
    sink(kafka.bootstrap, topic, tmp_path, lease_server.address)
    log, rejects = read_log(str(out)), read_rejects(str(out))
    client.close()

    # Case 1: every event once; the timed-out ones filled late; the resume's copies of what
    # was appended under g1 are DUPLICATE.
    assert sorted(labels(part(log, 0))) == sorted(f"a{s}" for s in range(13))
    assert len(labels(part(log, 0))) == 13
    assert list(verdicts(part(rejects, 0)).values()).count("DUPLICATE") == 7
    assert gaps_of(out, 0) == [("lost", 2, 3), ("filled", 2, 2), ("filled", 3, 3)]

    # Case 2: the successor adopted at 10 (its head reported), every zombie record FENCED.
    assert labels(part(log, 1)) == ["b10", "b11", "b12", "b13"]
    assert verdicts(part(rejects, 1)) == {"z10": "FENCED", "z11": "FENCED", "z12": "FENCED"}
    assert gaps_of(out, 1) == [("head", 0, 9)]
    assert labels(part(log, 3)) == ["c10", "c11", "c12", "c13"]
    assert verdicts(part(rejects, 3)) == {"y10": "FENCED", "y11": "FENCED", "y12": "FENCED"}

    # Case 4: g1's 4 (after g2's 5) FENCED; every event once, in seq order but the late fill.
    assert sorted(labels(part(log, 2))) == ["d0", "d1", "d2", "d3", "d4", "d5"]
    assert verdicts(part(rejects, 2))["x4"] == "FENCED"
    assert not any(r["generation"] == dg1 for r in part(log, 2) if r["seq"] > 3)

    # pidfence verify: the events the producers stand for (not the zombies' copies), each once;
    # the late fills are no reordering.
    events = [f"a{s}" for s in range(13)] + [f"b{s}" for s in range(10, 14)]
    events += [f"c{s}" for s in range(10, 14)] + [f"d{s}" for s in range(6)]
    report = verify(w.ledger(tmp_path / "ledger.jsonl", events), out)
    counts = {name: f["count"] for name, f in report["findings"].items()}
    assert counts["reordered"] == 0, report["findings"]["reordered"]
    for anomaly in ("duplicate", "zombie", "unexpected", "event_duplicate", "event_lost"):
        assert counts[anomaly] == 0, (anomaly, report["findings"][anomaly])


def expired_pid_resent(
    kafka: Any, new_topic: Any, lease_server_factory: Any, tmp_path: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Case 3: a pid's entry expires while the sink runs; retention deletes offsets while it is
    stopped; its re-sends of appended seqs then arrive beyond the horizon. The log and the
    rejects after the second run."""
    # Ended leases stay known for ten minutes: the lease servers answer "ended", with its end.
    leases = lease_server_factory(lifetime_ms=3_000, retention_ms=600_000)
    topic = new_topic(partitions=1)
    out = tmp_path / "out"
    client = LeaseClient(leases.address)
    w = Writer(kafka.bootstrap, topic)
    p = client.lease()
    q = client.lease()
    # Stamped two hours back (CreateTime): a record stamped now moves the sink's clock past
    # p's entry life (3 s plus the 1 h timestamp grace), as hours of a running sink would.
    back = int(time.time() * 1000) - 2 * 3_600_000
    w.write([(0, f"p{s}", p.pid, p.generation, s, 0) for s in range(6)], ts_ms=back)
    w.write([(0, "q0", q.pid, q.generation, 0, 0)])
    sink(kafka.bootstrap, topic, tmp_path, leases.address, "--lifetime", "3s")
    assert labels(part(read_log(str(out)), 0)) == [f"p{s}" for s in range(6)] + ["q0"]

    time.sleep(3.5)  # p's lease ends
    w.write([(0, "gone", q.pid, q.generation, 1, 0)])
    delete_records_before(kafka.bootstrap, topic, 8)  # deleted before the sink read it
    w.write([(0, f"p{s}", p.pid, p.generation, s, 0) for s in (3, 4, 5)])
    sink(
        kafka.bootstrap,
        topic,
        tmp_path,
        leases.address,
        "--lifetime",
        "3s",
        "--allow-data-loss",
    )
    client.close()
    assert "offsets" in read_gaps(str(out)).column("kind").to_pylist()
    return part(read_log(str(out)), 0), part(read_rejects(str(out)), 0)


def test_case_3_an_expired_pid_is_never_adopted_again(
    kafka: Any, new_topic: Any, lease_server_factory: Any, tmp_path: Path
) -> None:
    """Was: adopted beyond the horizon, appended twice."""
    log, rejects = expired_pid_resent(kafka, new_topic, lease_server_factory, tmp_path)
    assert labels(log) == [f"p{s}" for s in range(6)] + ["q0"]
    assert verdicts(rejects) == {"p3": "UNKNOWN_PID", "p4": "UNKNOWN_PID", "p5": "UNKNOWN_PID"}


def test_case_3_fails_when_the_lease_servers_call_an_ended_lease_live(
    kafka: Any,
    new_topic: Any,
    lease_server_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Teeth: the lease servers (in this process) run the mutant ``describe-end-plus-retention``
    (an ended lease answered with its end plus the retention): the sink adopts the re-sends and
    appends p3..p5 twice, which the case above refuses."""
    MUTATIONS["describe-end-plus-retention"](monkeypatch.setattr)  # type: ignore[call-arg]
    log, _ = expired_pid_resent(kafka, new_topic, lease_server_factory, tmp_path)
    assert labels(log) == [f"p{s}" for s in range(6)] + ["q0", "p3", "p4", "p5"]
