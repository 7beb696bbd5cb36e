"""`pidfence demo --faults net`: the seeded network nemesis on every link of the demo's pipeline.

The demo starts its own ZooKeeper and a Kafka whose producer and sink listeners advertise their
toxiproxy proxies (a Kafka given with ``--bootstrap`` cannot be proxied); the lease servers reach
ZooKeeper and the producers reach the lease servers through proxies too. The report must show the
seeded faults, each must have been put on its link, and the checker must find nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pidfence.demo import DemoConfig, Fault, run_demo
from pidfence.services.process import started_pids
from pidfence.testing import missing_reason

pytestmark = pytest.mark.timeout(600)


def test_demo_with_network_faults_shows_them_and_reports_zero_anomalies(
    tmp_path: Path, spark: Any
) -> None:
    if reason := missing_reason():
        pytest.skip(reason)
    before = started_pids()
    config = DemoConfig(
        records=400,
        producers=2,
        partitions=2,
        faults=frozenset({Fault.NET}),
        out=tmp_path / "out",
        copier_records=0,
        lease_lifetime_s=8.0,
        produce_seconds=12.0,
        seed=2024,
    )
    console = Console(record=True, width=160)
    summary = run_demo(config, console, spark=spark)

    shown = ("anomalies", "examples", "faults", "instances", "plan")
    assert summary["ok"], json.dumps({k: summary.get(k) for k in shown})
    assert summary["faults_happened"]["net"], summary["faults"]
    plan = config.plan
    assert summary["plan"] == {"seed": 2024, "steps": plan.describe()}
    on = [e for e in summary["faults"]["net"] if " on  " in e]
    assert len(on) == len(plan.network_steps), summary["faults"]["net"]
    assert summary["anomalies"]["event_duplicate"] == 0
    assert summary["anomalies"]["event_lost"] == 0
    assert summary["counts"]["appended"] == config.records * config.producers
    text = console.export_text()
    assert "network faults (seed 2024, replay: --seed 2024)" in text
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Network faults (seed 2024)" in page
    assert started_pids() <= before
