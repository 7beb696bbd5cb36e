"""`pidfence demo` end to end with small numbers, on the session's Kafka, ZooKeeper and Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pidfence.demo import DemoConfig, Fault, run_demo
from pidfence.services.process import started_pids

pytestmark = pytest.mark.timeout(420)


def test_demo_with_all_faults_reports_zero_anomalies(
    tmp_path: Path, kafka: Any, zookeeper: Any, spark: Any
) -> None:
    before = started_pids()
    config = DemoConfig(
        records=400,
        producers=3,
        partitions=2,
        faults=frozenset(Fault),
        out=tmp_path / "out",
        copier_records=300,
        lease_lifetime_s=8.0,
        produce_seconds=10.0,
        bootstrap=kafka.bootstrap,
        zk_hosts=zookeeper.hosts,
    )
    summary = run_demo(config, Console(record=True, width=120), spark=spark)

    shown = ("anomalies", "examples", "downstream")
    assert summary["ok"], json.dumps({k: summary[k] for k in shown})
    assert (tmp_path / "out" / "report.html").stat().st_size > 10_000
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written["counts"] == summary["counts"]
    # The faults really happened.
    assert summary["faults"]["kill"] and summary["faults"]["zombie"]
    assert summary["verdicts"].get("FENCE", 0) >= 1
    assert summary["counts"]["pids_used"] > 3  # restarts/rollovers leased more pids
    # Every process the demo started is gone (the session's services are not ours).
    assert started_pids() <= before
