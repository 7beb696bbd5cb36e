"""`pidfence demo` end to end with small numbers, on the session's Kafka, ZooKeeper and Spark.

Every fault is forced by a fact, not a duration (see ``pidfence.demo.faults``), and the test
asserts that each one really happened, so it cannot pass because a victim finished early.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pidfence.demo import DemoConfig, run_demo
from pidfence.demo.config import PROCESS_FAULTS
from pidfence.services.process import started_pids

pytestmark = pytest.mark.timeout(600)


def test_demo_with_all_faults_reports_zero_anomalies(
    tmp_path: Path, kafka: Any, zookeeper: Any, spark: Any
) -> None:
    before = started_pids()
    config = DemoConfig(
        records=400,
        producers=4,
        partitions=2,
        faults=PROCESS_FAULTS,
        out=tmp_path / "out",
        copier_records=300,
        lease_lifetime_s=8.0,
        produce_seconds=10.0,
        bootstrap=kafka.bootstrap,
        zk_hosts=zookeeper.hosts,
    )
    summary = run_demo(config, Console(record=True, width=120), spark=spark)

    shown = ("anomalies", "examples", "downstream", "faults", "instances")
    assert summary["ok"], json.dumps({k: summary[k] for k in shown})
    assert (tmp_path / "out" / "report.html").stat().st_size > 10_000
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written["counts"] == summary["counts"]
    # Every fault really happened.
    assert summary["faults_happened"] == {
        "kill": True, "zombie": True, "lease-zombie": True, "copier": True,
    }, summary["faults"]  # fmt: skip
    assert summary["verdicts"].get("FENCE", 0) >= 1
    # The zombie inside its lease wrote under its fenced generation, and the sink refused it
    # (some of its acknowledgements after SIGCONT are for records sent before the FENCE).
    assert summary["zombie_writes"]["zombie"] >= 1
    assert summary["verdicts"].get("FENCED", 0) >= 1
    # The zombie that outlived its lease stopped itself: its roll was refused.
    assert summary["instances"]["p2"] == "fenced", summary["faults"]["lease-zombie"]
    # It may still get acknowledgements after SIGCONT: records it handed to Kafka before the
    # pause (the pause comes from outside, whatever is in flight). It never sends under the
    # ended lease; the event checker below proves none of them is in the log twice.
    # Judged per event, not only per identity.
    assert summary["anomalies"]["event_duplicate"] == 0
    assert summary["anomalies"]["event_lost"] == 0
    assert summary["counts"]["pids_used"] > 4  # restarts/rollovers leased more pids
    # The lease servers ran with auth tokens and TLS (certificates made at start), and every
    # producer and copier authenticated through the environment: nothing leaked into ours.
    assert (tmp_path / "out" / "pki" / "ca.pem").exists()
    assert "PIDFENCE_LEASE_TOKEN_FILE" not in os.environ
    # Every process the demo started is gone (the session's services are not ours).
    assert started_pids() <= before
