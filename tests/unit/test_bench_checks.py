"""The other benches' own checks, with their services faked: a failed load process, a refused
victim, a copier group that stops, a soak whose faults never fired, records not acknowledged.
Each must end the run with its reason, and leave no process or scratch folder behind."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pidfence.benchkit import load_bench
from pidfence.demo.soak.config import SoakConfig
from pidfence.demo.soak.result import SoakResult

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


class _Proc:
    """A load process that exits with ``code`` when waited for."""

    def __init__(self, code: int, log: list[str]) -> None:
        self.code, self.log, self.returncode = code, log, None

    def wait(self, timeout: float | None = None) -> int:
        self.log.append(f"waited {self.code}")
        self.returncode = self.code
        return self.code

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.log.append("killed")


def test_every_load_process_is_waited_for_and_the_scratch_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lease = load_bench("lease", BENCH_DIR)
    log: list[str] = []
    codes = iter([1, 0])
    monkeypatch.setattr(lease.subprocess, "Popen", lambda argv: _Proc(next(codes), log))
    monkeypatch.setattr(lease.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    with pytest.raises(RuntimeError, match=r"exited with \[1, 0\]"):
        lease._drive(["127.0.0.1:1"], 80, None)
    assert log == ["waited 1", "waited 0"]  # the second too, after the first failed
    assert not (tmp_path / "scratch").exists()


def test_a_refused_victim_fails_the_lease_bench() -> None:
    lease = load_bench("lease", BENCH_DIR)
    rows = [
        {"contender": "victim bumps, 0 flooders", "victim_errors": 0, "bumps": 300},
        {"contender": "victim bumps, 2 flooders", "victim_errors": 3, "bumps": 310},
        {"contender": "1 server, plain, asyncio", "leases": 100},
    ]
    assert lease._victim_refused(rows) == [
        "victim bumps, 2 flooders: 3 of the victim's 310 bumps refused"
    ]


def test_a_refused_hello_ends_the_flood_rows_and_cleans_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    flood = load_bench("_lease_flood", BENCH_DIR)
    stopped: list[str] = []

    class Victim:
        def __init__(self, address: str, timeout: float) -> None:
            del address, timeout

        def call(self, op: str, **fields: Any) -> dict[str, Any]:
            return {"error": "UNAUTHORIZED"} if op == "hello" else {"error": None}

        def close(self) -> None:
            stopped.append("victim")

    bench = SimpleNamespace(
        _chroot=lambda hosts: hosts,
        _start_server=lambda *a: SimpleNamespace(address="127.0.0.1:1"),
        _stop=lambda server: stopped.append("server"),
    )
    token = tmp_path / "victim.token"
    token.write_text("t")
    pki = SimpleNamespace(tokens_file=tmp_path / "tokens", token_files={"victim": token})
    monkeypatch.setattr(flood._clients, "RawLease", Victim)
    monkeypatch.setattr(flood.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    with pytest.raises(RuntimeError, match="hello was refused"):
        flood.flood_rows(bench, "zk", pki, 10, 0.1, "asyncio")
    assert stopped == ["victim", "server"]
    assert not (tmp_path / "scratch").exists()


class _Member:
    def __init__(self, running: bool) -> None:
        self.running = running

    def tail(self, lines: int) -> str:
        return f"last {lines} lines"


def test_the_takeover_wait_ends_when_a_member_stops_or_time_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copier = load_bench("copier", BENCH_DIR)
    commits = SimpleNamespace(copied=lambda: 1_000)
    members = {"a": _Member(True), "b": _Member(False)}
    group = SimpleNamespace(current=lambda name: members[name])
    monkeypatch.setattr(copier.time, "sleep", lambda s: None)
    with pytest.raises(RuntimeError, match="member b ended at 1000 of 2000 committed"):
        copier.wait_committed(commits, group, ["a", "b"], 2_000)
    members["b"].running = True
    monkeypatch.setattr(copier, "WAIT_S", -1.0)
    with pytest.raises(RuntimeError, match="1000 of 2000 records committed after -1 s"):
        copier.wait_committed(commits, group, ["a", "b"], 2_000)
    copier.wait_committed(commits, group, ["a", "b"], 1_000)


def test_a_soak_whose_configured_faults_never_happened_fails(tmp_path: Path) -> None:
    soak = load_bench("soak", BENCH_DIR)
    # The integration test's one-minute run: one round of producer faults, one sink restart.
    config = SoakConfig(minutes=1.0, out=tmp_path, lease_lifetime_s=12.0, fault_every_s=30.0)
    assert soak.configured_faults(config) == ["kill", "zombie", "lease-zombie", "sink-restart"]
    steady = SoakConfig(minutes=3.0, out=tmp_path, fault_every_s=60.0, sink_restarts=False)
    assert soak.configured_faults(steady) == ["kill", "zombie", "lease-zombie"]
    full = SoakConfig(minutes=30.0, out=tmp_path)
    assert soak.configured_faults(full)[-2:] == ["sink-restart", "sink-crash"]

    happened = Counter({"kill": 1, "zombie": 1, "lease-zombie": 1})
    result = SoakResult(config={}, faults_happened=happened, anomalies={"event_lost": 0})
    assert result.ok  # what the soak checked before: no anomaly, no unexpected exit
    assert soak.soak_misses(result, config) == [
        "configured faults that never happened: sink-restart (each must happen at least once; "
        "happened: {'kill': 1, 'zombie': 1, 'lease-zombie': 1})"
    ]
    result.faults_happened["sink-restart"] = 1
    assert soak.soak_misses(result, config) == []
    result.failures.append("p2 exited with 1")
    result.anomalies["event_lost"] = 2
    assert soak.soak_misses(result, config) == [
        "anomalies {'event_lost': 2} (zero required)",
        "unexpected exits: p2 exited with 1",
    ]


def test_records_not_acknowledged_end_the_produce_bench() -> None:
    produce = load_bench("produce", BENCH_DIR)
    produce._acknowledged(0, 10, 10)
    produce._acknowledged(0, 10, None)
    with pytest.raises(RuntimeError, match="2 of 10 records not acknowledged"):
        produce._acknowledged(2, 10, None)
    with pytest.raises(RuntimeError, match="9 of 10 acknowledgements reported"):
        produce._acknowledged(0, 10, 9)
