"""`pidfence demo` end to end with small numbers, on the session's Kafka and ZooKeeper: the
command as `make demo` runs it (its own Spark driver), judged by its summary and its console.

Every fault is forced by a fact, not a duration (see ``pidfence.demo.faults``), and the test
asserts that each one really happened, so it cannot pass because a victim finished early. (The
demo as a library, ``run_demo`` on the session's Spark, is driven by ``test_demo_net``.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pidfence.cli.exits import EXIT_OK
from tests.fixtures.commands import timed_pidfence
from tests.fixtures.demo import left_running, small_demo_args, summary_of
from tests.integration.test_cli_sink import JVM_LINE

pytestmark = pytest.mark.timeout(600)


def test_demo_with_all_faults_reports_zero_anomalies_and_prints_only_its_own_lines(
    tmp_path: Path, kafka: Any, zookeeper: Any
) -> None:
    out = tmp_path / "out"
    result, _ = timed_pidfence(*small_demo_args(kafka, zookeeper, out), timeout=500)
    console = result.stdout + result.stderr
    shown = ("anomalies", "examples", "downstream", "faults", "instances")
    summary, verdict = summary_of(result, out, shown)
    assert result.returncode == EXIT_OK, (console[-3000:], verdict)
    assert summary["ok"], verdict
    assert (out / "report.html").stat().st_size > 10_000
    # Every fault really happened.
    assert summary["faults_happened"] == {
        "kill": True,
        "zombie": True,
        "lease-zombie": True,
        "copier": True,
        "resend": True,
        "rollover": True,
    }, summary["faults"]
    assert summary["anomalies"]["fault_missing"] == 0
    assert summary["anomalies"]["events_not_sent"] == 0
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
    # Made in the run folder: the README's quickstart keeps its own PKI in out/pki.
    assert (out / "run" / "pki" / "ca.pem").exists()
    assert not (out / "pki").exists()
    # Every process the demo started is gone (the session's services are not its own).
    assert left_running(out) == []

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
