"""The bench runner (``pidfence.benchkit``, ``pidfence bench``): where a run's figures go, what
it records, which files are benchmarks, and a SIGTERM that stops what a bench started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pidfence.benchkit import BenchNotFound, BenchReport, benchmarks, run_bench

BENCH = """
from pidfence.benchkit import BenchReport


def run(quick, progress):
    return BenchReport(title="t", rows=[{"contender": "x", "quick": quick}])
"""


@pytest.fixture
def bench_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bench folder with one benchmark ``tiny`` and one script; no setting in the env."""
    for name in [k for k in os.environ if k.startswith("PIDFENCE_BENCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("PIDFENCE_SOAK_MINUTES", raising=False)
    folder = tmp_path / "bench"
    folder.mkdir()
    (folder / "tiny.py").write_text(BENCH)
    (folder / "script.py").write_text('if __name__ == "__main__":\n    print("hi")\n')
    (folder / "_helper.py").write_text("X = 1\n")
    return folder


def _written(bench_dir: Path, stem: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((bench_dir / "results" / f"{stem}.json").read_text())
    return data


def test_only_a_full_run_with_the_defaults_writes_the_quoted_file(
    bench_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_bench("tiny", quick=False, bench_dir=bench_dir)
    full = _written(bench_dir, "tiny")
    assert full["command"] == "pidfence bench tiny" and full["settings"] == {}

    run_bench("tiny", quick=True, bench_dir=bench_dir)
    monkeypatch.setenv("PIDFENCE_BENCH_RECORDS", "300 000")
    run_bench("tiny", quick=False, bench_dir=bench_dir)
    # Neither the quick run nor the one with a setting replaced the full run's figures.
    assert _written(bench_dir, "tiny") == full
    small = _written(bench_dir, "tiny-quick")
    assert small["settings"] == {"PIDFENCE_BENCH_RECORDS": "300 000"}
    assert small["command"] == "PIDFENCE_BENCH_RECORDS='300 000' pidfence bench tiny"
    previous = small["previous"]
    assert isinstance(previous, dict) and previous["command"] == "pidfence bench tiny --quick"


def test_a_script_without_run_is_no_benchmark(bench_dir: Path) -> None:
    assert benchmarks(bench_dir) == ["tiny"]
    with pytest.raises(BenchNotFound, match=r"script\.py is a script, not a benchmark"):
        run_bench("script", quick=True, bench_dir=bench_dir)
    with pytest.raises(BenchNotFound, match=r"no benchmark 'nope' .*\(known: tiny\)"):
        run_bench("nope", quick=True, bench_dir=bench_dir)
    assert not (bench_dir / "results").exists()


def test_the_real_scripts_are_not_listed_as_benchmarks() -> None:
    names = benchmarks(Path(__file__).resolve().parents[2] / "bench")
    assert "produce_ab" not in names and "sink_task_cost" not in names
    assert {"sink", "produce", "soak", "lease"} <= set(names)


def test_a_check_that_missed_fails_the_report_and_says_why() -> None:
    report = BenchReport(title="t", rows=[])
    assert report.check([], "all there").failed is None and report.notes == ["all there"]
    report.check(["(c) wrote 9 rows, expected 10"], "all there")
    assert report.failed == "(c) wrote 9 rows, expected 10"
    assert report.notes[-1] == "FAILED: (c) wrote 9 rows, expected 10"


# A bench that starts a service in a session of its own (as KafkaCluster does), then waits.
SERVICE = """
import subprocess, sys, time
from pathlib import Path


def run(quick, progress):
    here = Path(__file__).parent
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    (here / "child.pid").write_text(str(child.pid))
    try:
        time.sleep(600)
    finally:
        child.kill()
        child.wait()
        (here / "stopped").write_text("yes")
"""


def test_sigterm_stops_what_the_bench_started_and_exits_143(bench_dir: Path) -> None:
    (bench_dir / "service.py").write_text(SERVICE)
    code = "import sys; from pidfence.cli import main; sys.argv[0] = 'pidfence'; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "bench", "service", "--bench-dir", str(bench_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pid_file = bench_dir / "child.pid"
    child = 0
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.05)
        child = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err.decode()
        assert "stopped by SIGTERM" in err.decode()
        assert (bench_dir / "stopped").read_text() == "yes"
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
    finally:
        for pid in (proc.pid, child):  # whatever a failure left running
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait()
