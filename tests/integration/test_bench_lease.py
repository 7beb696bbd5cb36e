"""Smoke test: ``bench/lease.py`` runs every contender and the flood rows on tiny sizes (figures
are not asserted: speed is measured by the bench, never by tests)."""

from __future__ import annotations

from pathlib import Path

from rich.progress import Progress

from pidfence.benchkit import load_bench
from pidfence.pid_allocator.loops import uvloop_installed

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def test_lease_bench_runs_every_contender() -> None:
    bench = load_bench("lease", BENCH_DIR)
    bench.QUICK_LEASES = bench.CLIENTS * 10
    bench.QUICK_BASELINE_LEASES = bench.CLIENTS * 2
    bench.WARMUP_LEASES = bench.CLIENTS * 2
    bench.QUICK_FLOOD_BUMPS, bench.QUICK_FLOOD_S = 10, 0.5
    with Progress(disable=True) as progress:
        report = bench.run(quick=True, progress=progress)
    loops = 2 if uvloop_installed() else 1
    leases, flood = report.rows[:-3], report.rows[-3:]
    assert len(leases) == 2 * loops + 2
    assert {row["security"] for row in leases} == {"plain", "auth+TLS"}
    assert [row["flooders"] for row in flood] == [0, 1, 2]
    for row in flood:
        assert row["bumps"] >= 10 and row["bumps_per_s"] > 0
        assert row["p99_ms"] >= row["p50_ms"] > 0
        assert [c.get("None", 0) > 0 for c in row["flood_counts"]] == [True] * row["flooders"]
    for row in leases:
        assert row["leases"] == (
            bench.QUICK_BASELINE_LEASES if row["block_size"] == 1 else bench.QUICK_LEASES
        )
        assert row["server_cpu_us_per_lease"] >= 0
        assert row["p99_ms"] >= row["p50_ms"] > 0


def test_a_server_that_spent_less_than_a_clock_tick_gets_no_capacity_ratio() -> None:
    bench = load_bench("lease", BENCH_DIR)
    row = {"loop": "asyncio", "servers": 1, "block_size": 100, "leases_per_s": 500.0}
    plain = {**row, "security": "plain", "server_cpu_us_per_lease": 40.0}
    secure = {**row, "security": "auth+TLS", "server_cpu_us_per_lease": 0.0}
    assert bench._ratios([plain, secure]) == {"asyncio_secure_throughput_ratio": 1.0}
    secure["server_cpu_us_per_lease"] = 80.0
    assert bench._ratios([plain, secure])["asyncio_secure_capacity_ratio"] == 0.5
