"""`pidfence bench soak` on tiny sizes: one minute of producing, every fault once, zero anomalies.

The bench starts its own ZooKeeper, Kafka, lease servers and sink process, like a real run. The
test asserts what happened (faults, samples, the checker's verdict), never how fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.progress import Progress

from pidfence.benchkit import load_bench
from pidfence.demo.config import BadDemoOption
from pidfence.demo.procstat import parse_stat_ppid
from pidfence.demo.soak.config import MINUTES_ENV, SoakConfig, config_from_env
from pidfence.demo.soak.figures import slope_per_10min
from pidfence.services.process import started_pids

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow  # over a minute: handed out first under xdist (tests/README.md)
def test_soak_bench_runs_every_fault_and_finds_no_anomaly(tmp_path: Path) -> None:
    before = started_pids()
    bench = load_bench("soak", BENCH_DIR)
    config = SoakConfig(
        minutes=1.0,
        out=tmp_path / "soak",
        plot=tmp_path / "soak.png",
        lease_lifetime_s=12.0,
        fault_every_s=30.0,
        sample_s=15.0,
        rate=50.0,  # half the bench's load: this run proves its faults and figures, not load
    )
    with Progress(disable=True) as progress:
        report = bench.soak_bench(config, progress)

    params = report.params
    assert params["ok"], json.dumps({k: params[k] for k in ("anomalies", "examples", "failures")})
    assert params["anomalies"]["event_duplicate"] == 0
    assert params["anomalies"]["event_lost"] == 0
    assert not any(params["anomalies"].values()), params["examples"]
    # Every fault really happened at least once (a run where none fired cannot pass).
    happened = params["faults_happened"]
    for fault in ("kill", "zombie", "lease-zombie", "sink-restart"):
        assert happened.get(fault, 0) >= 1, (fault, params["faults"])
    # The replacements' FENCE markers reached the sink. A woken zombie's own records are FENCED
    # only if it sends one before its refused roll stops it, which a one-minute run's short
    # leases often prevent (seen: its 13 late acknowledgements were of records it wrote before
    # the fence); none may be appended either way (``anomalies`` above has a ``zombie`` check).
    assert params["verdicts"].get("FENCE", 0) >= 1
    assert params["verdicts"].get("DUPLICATE", 0) >= 1
    # The samples are written as they are taken, with the RSS of every process tree.
    lines = (tmp_path / "soak" / "samples.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in lines]
    assert len(samples) >= 4
    expected = {"zookeeper", "kafka", "lease-0", "lease-1", "p0", "p1", "p2", "p3", "harness"}
    assert expected <= set(samples[-1]["rss"])
    assert any(s["rss"].get("spark JVM", 0) > 0 for s in samples)
    assert samples[-1]["records_in"] > 0
    assert {row["series"] for row in report.rows} >= {"RSS kafka", "state bytes"}
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    # Everything the bench started was stopped.
    assert started_pids() <= before


def test_soak_minutes_come_from_the_environment(tmp_path: Path) -> None:
    env = {MINUTES_ENV: "7.5", "PIDFENCE_SOAK_OUT": str(tmp_path)}
    assert config_from_env(False, None, env).minutes == 7.5
    assert config_from_env(True, None, {"PIDFENCE_SOAK_OUT": str(tmp_path)}).minutes == 3.0
    full = config_from_env(False, None, {"PIDFENCE_SOAK_OUT": str(tmp_path)})
    assert (full.minutes, full.fault_every_s, full.sample_s) == (30.0, 300.0, 60.0)
    with pytest.raises(BadDemoOption, match=MINUTES_ENV):
        config_from_env(False, None, {MINUTES_ENV: "half an hour"})


def test_the_steady_soak_runs_two_hours_on_one_sink_instance(tmp_path: Path) -> None:
    steady = config_from_env(False, None, {"PIDFENCE_SOAK_OUT": str(tmp_path)}, steady=True)
    assert (steady.minutes, steady.trigger_s, steady.sink_restarts) == (120.0, 0.5, False)
    assert config_from_env(False, None, {"PIDFENCE_SOAK_OUT": str(tmp_path)}).sink_restarts


@pytest.mark.slow  # over a minute: handed out first under xdist (tests/README.md)
def test_a_steady_soak_never_restarts_the_sink_and_counts_its_files(tmp_path: Path) -> None:
    bench = load_bench("soak", BENCH_DIR)
    config = SoakConfig(
        minutes=1.0,
        out=tmp_path / "soak",
        lease_lifetime_s=12.0,
        fault_every_s=30.0,
        sample_s=15.0,
        rate=50.0,
        trigger_s=0.5,
        sink_restarts=False,
    )
    with Progress(disable=True) as progress:
        report = bench.soak_bench(config, progress)

    params = report.params
    assert params["ok"], json.dumps({k: params[k] for k in ("anomalies", "examples", "failures")})
    assert "sink-restart" not in params["faults_happened"]
    assert "sink-crash" not in params["faults_happened"]
    # One streaming instance from start to end, then the final available-now drain.
    assert params["counts"]["sink_instances"] == 2
    # Every sample counts the bookkeeping (a loaded machine may commit the first batch late:
    # the counts themselves are the bench's figures, not this test's).
    assert all("pidfence_files" in s and "delta_log_files" in s for s in params["samples"])
    assert {"files under _pidfence/", "files under _delta_log/"} <= {
        row["series"] for row in report.rows
    }


def test_parent_pid_parsing_survives_odd_command_names() -> None:
    assert parse_stat_ppid("42 (a) b (c)) S 7 42 42 0 -1") == 7


def test_slope_is_per_ten_minutes() -> None:
    assert slope_per_10min([(0.0, 100.0), (600.0, 100.0)]) == 0.0
    assert slope_per_10min([(0.0, 0.0), (60.0, 1.0), (120.0, 2.0)]) == pytest.approx(10.0)
    assert slope_per_10min([(5.0, 1.0)]) is None
