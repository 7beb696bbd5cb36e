"""The demo's verdict checks the run did what it was asked: every requested fault happened, every
producer's events were sent, the copier had its records, nothing crashed; and it uses the
checker ``pidfence verify`` runs, guards included. Readers of Kafka and the output are replaced
(no process is started)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from rich.console import Console

from pidfence.demo import DemoConfig, Fault
from pidfence.demo import summary as summary_module
from pidfence.demo.produce import crashed_on_its_own, ended_as_planned
from pidfence.demo.record import DemoPaths, DemoRecord, FaultOutcome, Produced
from pidfence.demo.report import render_html, summary_table
from pidfence.demo.summary import (
    CheckerCannotRun,
    collect,
    events_not_sent,
    ledger_entries,
    rolled_over,
    run_checker,
)


def _entry(pid: int, seq: int, event: str, fence: bool = False) -> str:
    return json.dumps(
        {
            "pid": pid,
            "generation": 0,
            "topic": "raw",
            "partition": 0,
            "seq": seq,
            "digest": f"d{event}",
            "offset": seq,
            "ts_ms": 1000,
            "fence": fence,
            "event": event,
        }
    )


def _ledgers(folder: Path, per_instance: dict[str, list[tuple[int, int, str]]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for instance, entries in per_instance.items():
        lines = [_entry(pid, seq, event) for pid, seq, event in entries]
        (folder / f"{instance}.jsonl").write_text("\n".join(lines) + "\n")


def test_rolled_over_needs_a_second_pid_on_a_producer_other_than_the_lease_zombies(
    tmp_path: Path,
) -> None:
    _ledgers(tmp_path, {"p0": [(1, 0, "a")], "p1": [(2, 0, "b")], "p1.r1": [(3, 0, "c")]})
    ledgers = ledger_entries(tmp_path)
    assert rolled_over(ledgers, {"p0", "p1"}, skip="")
    # p1's second pid may be the lease-zombie replacement's successor pid, not a rollover.
    assert not rolled_over(ledgers, {"p0", "p1"}, skip="p1")
    # The copier's pids are not the producers'.
    _ledgers(tmp_path, {"copier": [(9, 0, "x")], "copier.r1": [(10, 0, "y")]})
    assert not rolled_over(ledger_entries(tmp_path), {"p0", "p1"}, skip="p1")


def test_events_not_sent_counts_each_producers_missing_events(tmp_path: Path) -> None:
    _ledgers(
        tmp_path,
        {"p0": [(1, 0, "a"), (1, 1, "b")], "p0.r1": [(1, 1, "b"), (1, 2, "c")], "p1": []},
    )
    ledgers = ledger_entries(tmp_path)
    assert events_not_sent(ledgers, {"p0", "p1"}, records=3) == {"p1": 3}
    assert events_not_sent(ledgers, {"p0"}, records=3) == {}


def test_the_checker_refuses_an_empty_ledger_folder(tmp_path: Path) -> None:
    (tmp_path / "ledgers").mkdir()
    (tmp_path / "output").mkdir()
    with pytest.raises(CheckerCannotRun, match="holds no"):
        run_checker(tmp_path / "ledgers", str(tmp_path / "output"))


def _readers(monkeypatch: pytest.MonkeyPatch, upstream_rows: int = 0) -> list[Any]:
    """Kafka, the output and the checker replaced by empty tables and a clean report."""
    checked: list[Any] = []
    log = pa.table(
        {"pid": pa.array([], pa.int64()), "value": pa.array([], pa.binary()), "timestamp": []}
    )
    rejects = pa.table({"pid": pa.array([], pa.int64()), "verdict": pa.array([], pa.string())})
    raw = pa.table(
        {
            "pf": pa.array([], pa.binary()),
            "timestamp": pa.array([], pa.int64()),
            "value": pa.array([], pa.binary()),
        }
    )
    upstream = pa.table({"value": [f"u{i}".encode() for i in range(upstream_rows)]})
    minutes = pa.table({"minute": [], "users": [], "events": []})

    def read_topic(bootstrap: str, topic: str) -> pa.Table:
        return upstream if topic == "upstream" else raw

    monkeypatch.setattr(summary_module, "run_checker", lambda *a: checked.append(a))
    monkeypatch.setattr(summary_module, "anomaly_counts", lambda report: {"lost": 0})
    monkeypatch.setattr(summary_module, "informational_counts", lambda report: {})
    monkeypatch.setattr(summary_module, "anomaly_examples", lambda report: {})
    monkeypatch.setattr("pidfence.spark_sink.read_log", lambda output: log)
    monkeypatch.setattr("pidfence.spark_sink.read_rejects", lambda output: rejects)
    monkeypatch.setattr("pidfence.demo.topic.read_topic", read_topic)
    monkeypatch.setattr("pidfence.verify.downstream.truth_from_ledger", lambda *a: minutes)
    monkeypatch.setattr("pidfence.verify.downstream.unique_users_per_minute", lambda t: minutes)
    return checked


def _record(
    tmp_path: Path,
    config: DemoConfig,
    happened: dict[str, bool],
    copier: tuple[Any, ...] = (),
    crashed: tuple[str, ...] = (),
) -> DemoRecord:
    ends = SimpleNamespace(
        output=str(tmp_path / "output"), bootstrap="k:1", raw_topic="raw", upstream_topic="upstream"
    )
    outcome = FaultOutcome(events={}, happened=happened, zombie_writes={}, crashed=crashed)
    return DemoRecord(
        config,
        DemoPaths(tmp_path),
        ends,
        Produced((), copier, outcome),
        (),
        {},  # type: ignore[arg-type]
    )


def _two_producers_done(tmp_path: Path, rolled: bool = False) -> None:
    events = [(1, i, f"p0-{i}") for i in range(100)]
    other = [(2 if i < 50 or not rolled else 3, i, f"p1-{i}") for i in range(100)]
    _ledgers(tmp_path / "ledgers", {"p0": events, "p1": other})


def test_a_requested_fault_that_did_not_happen_fails_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = _readers(monkeypatch)
    _two_producers_done(tmp_path)
    config = DemoConfig(records=100, producers=2, faults=frozenset({Fault.KILL}))
    summary = collect(_record(tmp_path, config, {"kill": False}))
    assert checked == [(tmp_path / "ledgers", str(tmp_path / "output"))]
    assert not summary["ok"]
    assert summary["anomalies"]["fault_missing"] == 1
    assert summary["examples"]["fault_missing"] == ["kill: requested, did not happen"]
    assert collect(_record(tmp_path, config, {"kill": True}))["ok"]


def test_rollover_counts_only_when_a_producer_rolled_to_a_new_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _readers(monkeypatch)
    config = DemoConfig(records=100, producers=2, faults=frozenset({Fault.ROLLOVER}))
    _two_producers_done(tmp_path)
    summary = collect(_record(tmp_path, config, {}))
    assert summary["faults_happened"] == {"rollover": False} and not summary["ok"]
    _two_producers_done(tmp_path, rolled=True)
    summary = collect(_record(tmp_path, config, {}))
    assert summary["faults_happened"] == {"rollover": True} and summary["ok"]


def test_work_left_undone_fails_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _readers(monkeypatch, upstream_rows=150)
    _ledgers(tmp_path / "ledgers", {"p0": [(1, i, f"p0-{i}") for i in range(60)]})
    config = DemoConfig(records=100, producers=1, faults=frozenset(), copier_records=200)
    summary = collect(_record(tmp_path, config, {}, copier=(_copier(),)))
    assert summary["anomalies"]["events_not_sent"] == 40
    assert summary["anomalies"]["copier_upstream_short"] == 50
    assert not summary["ok"]


def test_a_crashed_producer_is_an_anomaly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _readers(monkeypatch)
    _two_producers_done(tmp_path)
    config = DemoConfig(records=100, producers=2, faults=frozenset())
    line = "p1 exited with 1 (log out/logs/p1.log)"
    summary = collect(_record(tmp_path, config, {}, crashed=(line,)))
    assert summary["anomalies"]["process_crashed"] == 1
    assert summary["examples"]["process_crashed"] == [line]
    assert not summary["ok"]


def _copier() -> Any:
    return SimpleNamespace(name="copier", final_state=lambda: "done", exit_code=lambda: 0)


def _worker(code: int | None, fate: str | None = None, log: str = "") -> Any:
    return SimpleNamespace(name="p0", exit_code=lambda: code, fate=fate, tail=lambda lines=30: log)


def test_only_a_sigkill_the_demo_sent_is_accepted() -> None:
    assert ended_as_planned(_worker(0))
    assert ended_as_planned(_worker(-9, "killed"))
    assert ended_as_planned(_worker(-9, "replaced"))
    assert not ended_as_planned(_worker(-9))  # the OOM killer's, or someone else's
    assert not ended_as_planned(_worker(3))
    assert ended_as_planned(_worker(75), retried={"p0"})


def test_a_crash_is_told_from_an_environment_failure() -> None:
    assert crashed_on_its_own(_worker(1))
    assert crashed_on_its_own(_worker(-6, log="Traceback (most recent call last):\n"))
    assert not crashed_on_its_own(_worker(3, log="error: Kafka unreachable"))


def test_the_copier_outlasts_the_silences_the_network_plan_can_cause() -> None:
    """A copier that idles out while upstream still sends misses records (``copier_missing``):
    under ``net`` its idle-exit covers the longest silence the toxics on the producers' and
    lease links cause, reconnects included; toxics on the sink's link cannot silence it."""
    from pidfence.demo.produce import (
        COPIER_IDLE_EXIT_S,
        RECONNECT_BACKOFF_MAX_S,
        copier_idle_exit_s,
    )
    from pidfence.testing.plan import FaultKind, FaultPlan, Link, step

    def plan(*spans: tuple[Link, float, float]) -> FaultPlan:
        return FaultPlan(
            tuple(step(FaultKind.BLACKHOLE, link, at_s=at, duration_s=d) for link, at, d in spans)
        )

    base, backoff = COPIER_IDLE_EXIT_S, RECONNECT_BACKOFF_MAX_S
    assert copier_idle_exit_s(FaultPlan(())) == base  # no toxic: as before
    assert copier_idle_exit_s(plan((Link.SINK_KAFKA, 0.0, 4.0))) == base
    # A 4 s blackhole on the producers' link: more than the 6 s the copier had.
    one = copier_idle_exit_s(plan((Link.PRODUCER_KAFKA, 3.0, 4.0)))
    assert one == base + 4.0 + backoff
    # Toxics closer than a reconnect are one silence, from the first start to the last end.
    close = plan((Link.PRODUCER_KAFKA, 2.0, 3.0), (Link.PRODUCER_LEASE, 9.0, 3.0))
    assert copier_idle_exit_s(close) == base + 10.0 + backoff
    # Far apart, the longest alone counts.
    apart = plan((Link.LEASE_ZOOKEEPER, 0.0, 4.0), (Link.PRODUCER_KAFKA, 20.0, 2.0))
    assert copier_idle_exit_s(apart) == base + 4.0 + backoff


def _summary(happened: dict[str, bool]) -> dict[str, Any]:
    return {
        "ok": all(happened.values()),
        "counts": {
            "sent_acknowledged": 1,
            "sent_distinct": 1,
            "fences_acknowledged": 0,
            "pids_used": 1,
            "raw_records": 1,
            "appended": 1,
        },
        "config": {},
        "verdicts": {"APPENDED": 1},
        "anomalies": {"fault_missing": 0 if all(happened.values()) else 1},
        "faults": {"kill": ["SIGKILL p0"], "zombie": []},
        "faults_happened": happened,
        "downstream": {"raw": {}, "output_log": {}, "truth": {}},
    }


def test_the_report_shows_whether_each_fault_happened() -> None:
    summary = _summary({"kill": True, "zombie": False})
    console = Console(record=True, width=120)
    console.print(summary_table(summary))
    text = console.export_text()
    assert "fault: kill" in text and "happened" in text
    assert "fault: zombie" in text and "did not happen" in text
    page = render_html(summary, {})
    assert '<b>zombie</b> <span class="bad">did not happen</span>' in page
    assert '<b>kill</b> <span class="ok">happened</span>' in page
