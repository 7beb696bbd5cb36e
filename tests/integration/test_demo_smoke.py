"""`pidfence demo` end to end with small numbers, on the session's Kafka and ZooKeeper: the
command as `make demo` runs it (its own Spark driver), judged by its summary and its console.

Every fault is forced by a fact, not a duration (see ``pidfence.demo.faults``), and the test
asserts that each one really happened, so it cannot pass because a victim finished early. (The
demo as a library, ``run_demo`` on the session's Spark, is driven by ``test_demo_net``.)
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from pidfence.cli.exits import EXIT_OK
from tests.fixtures.commands import timed_pidfence
from tests.integration.test_cli_sink import JVM_LINE

pytestmark = pytest.mark.timeout(600)


def _running_with(folder: Path) -> list[str]:
    """Command lines of live processes that name ``folder`` (the demo's children do)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if str(folder) in text:
            found.append(text)
    return found


def _left_running(folder: Path, grace_s: float = 30.0) -> list[str]:
    """:func:`_running_with` after up to ``grace_s``: the Spark driver JVM leaves after its Python
    driver (it notices the closed pipe), so it may outlive the command by a moment."""
    deadline = time.monotonic() + grace_s
    while (left := _running_with(folder)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_demo_with_all_faults_reports_zero_anomalies_and_prints_only_its_own_lines(
    tmp_path: Path, kafka: Any, zookeeper: Any
) -> None:
    out = tmp_path / "out"
    result, _ = timed_pidfence(
        "demo",
        "--records",
        "400",
        "--producers",
        "4",
        "--partitions",
        "2",
        "--copier-records",
        "300",
        "--lease-lifetime",
        "8",
        "--produce-seconds",
        "10",
        "--bootstrap",
        kafka.bootstrap,
        "--zk",
        zookeeper.hosts,
        "--out",
        str(out),
        timeout=500,
    )
    console = result.stdout + result.stderr
    assert (out / "summary.json").exists(), console[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    shown = ("anomalies", "examples", "downstream", "faults", "instances")
    verdict = json.dumps({k: summary.get(k) for k in shown})
    assert result.returncode == EXIT_OK, (console[-3000:], verdict)
    assert summary["ok"], verdict
    assert (out / "report.html").stat().st_size > 10_000
    # Every fault really happened.
    assert summary["faults_happened"] == {
        "kill": True,
        "zombie": True,
        "lease-zombie": True,
        "copier": True,
    }, summary["faults"]
    assert summary["verdicts"].get("FENCE", 0) >= 1
    # The zombie inside its lease wrote under its fenced generation, and the sink refused it
    # (some of its acknowledgements after SIGCONT are for records sent before the FENCE).
    assert summary["zombie_writes"]["zombie"] >= 1
    assert summary["verdicts"].get("FENCED", 0) >= 1
    # The zombie that outlived its lease stopped itself: its roll was refused.
    assert summary["instances"]["p2"] == "fenced", summary["faults"]["lease-zombie"]
    # It may still get acknowledgements after SIGCONT: records it handed to Kafka before the
    # pause (the pause comes from outside, whatever is in flight). It never sends under the
    # ended lease; the event checker proves none of them is in the log twice.
    # Judged per event, not only per identity.
    assert summary["anomalies"]["event_duplicate"] == 0
    assert summary["anomalies"]["event_lost"] == 0
    assert summary["counts"]["pids_used"] > 4  # restarts/rollovers leased more pids
    # The lease servers ran with auth tokens and TLS (certificates made at start), and every
    # producer and copier authenticated through the environment.
    assert (out / "pki" / "ca.pem").exists()
    # Every process the demo started is gone (the session's services are not its own).
    assert _left_running(out) == []

    # What the user saw: the demo's own lines only; the JVM's are in out/logs/spark.log.
    assert "pidfence demo" in result.stdout  # the summary table
    assert not JVM_LINE.search(console), JVM_LINE.search(console)
    assert re.search(r"sink pass \d: batch \d+: [\d,]+ in → [\d,]+ appended", console), console
    # Where the lease servers and the sink serve their Prometheus metrics.
    served = re.findall(r"metrics: (lease-0|lease-1|sink) http://127\.0\.0\.1:\d+/metrics", console)
    assert sorted(served) == ["lease-0", "lease-1", "sink"], console
    assert "WARN" in (out / "logs" / "spark.log").read_text()  # Spark did talk, into the file
    for name in ("p0", "p1", "p2", "upstream", "copier"):  # every bar ends in a final state
        # The bars are printed again whenever a line is logged above them; the last print is
        # their final state.
        bars = re.findall(rf"^\s*{re.escape(name)} .*$", result.stdout, re.MULTILINE)
        assert bars and "running" not in bars[-1], result.stdout
