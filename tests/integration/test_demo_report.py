"""The demo's pure parts: fault parsing, summary helpers and the HTML report (no processes)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from rich.console import Console

from pidfence.demo.config import PROCESS_FAULTS, BadDemoOption, DemoConfig, Fault, parse_faults
from pidfence.demo.report import network_lines, render_html, summary_table, write_report
from pidfence.demo.summary import (
    copier_exactly_once,
    cumulative_per_second,
    producer_of,
    verdicts_per_producer,
)
from pidfence.testing import FaultKind, Link


def test_parse_faults_accepts_all_none_and_lists() -> None:
    assert parse_faults("all") == PROCESS_FAULTS == frozenset(Fault) - {Fault.NET}
    assert parse_faults("all,net") == frozenset(Fault)
    assert parse_faults("none") == frozenset()
    assert parse_faults("kill, zombie") == {Fault.KILL, Fault.ZOMBIE}


def test_the_demo_faults_are_one_plan() -> None:
    plan = DemoConfig(faults=frozenset(Fault), seed=11, produce_seconds=20.0).plan
    kinds = {(s.kind, s.target) for s in plan if not s.network}
    assert kinds == {
        (FaultKind.KILL, "p0"),
        (FaultKind.ZOMBIE, "p1"),
        (FaultKind.LEASE_ZOMBIE, "p2"),
        (FaultKind.RESEND, "p3"),
        (FaultKind.ROLLOVER, "lease"),
        (FaultKind.KILL, "copier"),
    }
    assert {Link(s.target) for s in plan.network_steps} == set(Link)
    assert plan == DemoConfig(faults=frozenset(Fault), seed=11, produce_seconds=20.0).plan
    assert plan.seed == 11
    assert not DemoConfig(faults=PROCESS_FAULTS).plan.network_steps


def test_parse_faults_names_the_allowed_values() -> None:
    with pytest.raises(BadDemoOption, match="rollover"):
        parse_faults("kill,explode")


def test_config_refuses_too_few_producers_for_the_faults() -> None:
    with pytest.raises(BadDemoOption, match="--producers"):
        DemoConfig(producers=2, faults=frozenset(Fault))


def test_producer_of_strips_the_instance_suffix() -> None:
    assert producer_of("p1.r2") == "p1"
    assert producer_of("copier") == "copier"


def test_cumulative_per_second_counts_running_totals() -> None:
    assert cumulative_per_second([1000, 1500, 3000], 1000) == [(0.0, 2), (2.0, 3)]


def test_verdicts_per_producer_maps_pids_to_names() -> None:
    log = pa.table({"pid": [1, 1, 2]})
    rejects = pa.table({"pid": [1, 3], "verdict": ["DUPLICATE", "FENCED"]})
    got = verdicts_per_producer(log, rejects, {1: "p0", 2: "p1"})
    assert got == {
        "other": {"FENCED": 1},
        "p0": {"APPENDED": 2, "DUPLICATE": 1},
        "p1": {"APPENDED": 1},
    }


def test_copier_check_finds_missing_and_duplicated_values() -> None:
    upstream = pa.table({"value": [b"a", b"b", b"c"]})
    log = pa.table({"value": [b"a", b"b", b"b", b"x"]})
    assert copier_exactly_once(upstream, log) == {
        "upstream": 3,
        "copied_once": 1,
        "missing": 1,
        "duplicated": 1,
    }


def _summary(ok: bool) -> dict[str, object]:
    return {
        "ok": ok,
        "wall_s": 12.5,
        "config": {"records": 10},
        "counts": {
            "sent_acknowledged": 10,
            "sent_distinct": 10,
            "fences_acknowledged": 1,
            "pids_used": 2,
            "raw_records": 12,
            "appended": 10,
        },
        "verdicts": {"APPENDED": 10, "DUPLICATE": 1, "FENCE": 1},
        "verdicts_per_producer": {"p0": {"APPENDED": 10, "DUPLICATE": 1}},
        "anomalies": {"lost": 0 if ok else 3, "duplicate": 0},
        "informational": {"expired": 0},
        "copier": {},
        "faults": {"kill": ["SIGKILL p0 <after> 5"]},
        "downstream": {
            "raw": {"2026-01-01 00:00": [5, 9]},
            "output_log": {"2026-01-01 00:00": [5, 7]},
            "truth": {"2026-01-01 00:00": [5, 7]},
        },
        "timeline": {"raw": [(0.0, 6), (1.0, 12)], "appended": [(0.0, 5), (1.0, 10)]},
    }


def test_report_files_are_written_and_escape_text(tmp_path: Path) -> None:
    console = Console(record=True, width=120)
    write_report(_summary(ok=False), tmp_path, console)
    page = (tmp_path / "report.html").read_text()
    assert "ANOMALIES FOUND" in page
    assert "&lt;after&gt;" in page  # event text is escaped
    assert page.count("data:image/png;base64,") == 3
    assert (tmp_path / "summary.json").exists()
    assert "ANOMALIES" in console.export_text()


def test_the_report_shows_the_network_faults_and_how_to_replay_them(tmp_path: Path) -> None:
    summary = _summary(ok=True)
    plan = DemoConfig(faults=frozenset({Fault.NET}), seed=5, producers=1).plan
    summary["plan"] = {"seed": 5, "steps": plan.describe()}
    summary["faults"] = {"net": ["t=1.0s on  producer-kafka: one-way-loss for 3.0s"]}
    rows = dict(network_lines(summary))
    assert rows["network faults (seed 5, replay: --seed 5)"] == str(len(plan.network_steps))
    assert "one-way-loss" in rows["  net: producer-kafka"]
    write_report(summary, tmp_path, Console(record=True, width=160))
    page = (tmp_path / "report.html").read_text()
    assert "Network faults (seed 5)" in page and "--faults net --seed 5" in page
    assert network_lines(_summary(ok=True)) == []


def test_summary_table_says_ok_when_clean() -> None:
    console = Console(record=True, width=120)
    console.print(summary_table(_summary(ok=True)))
    assert "OK: zero anomalies" in console.export_text()
    assert "OK: zero anomalies" in render_html(_summary(ok=True), {})


def test_report_says_how_to_open_the_delta_table_in_polars_and_spark() -> None:
    summary = _summary(ok=True) | {"output": "/runs/demo/output"}
    page = render_html(summary, {})
    assert 'pl.read_delta("/runs/demo/output")' in page
    assert 'spark.read.format("delta").load("/runs/demo/output")' in page
