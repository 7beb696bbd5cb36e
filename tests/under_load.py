"""Run test selections several times in a row while another process keeps one core busy.

Issue 10's "no timing luck": a test that passes or fails with machine load is a defect. This
runs ``pytest ARGS`` ``--times`` times in a row, each in a fresh session, while a spinning
process pinned to the last core (``taskset``, when present) competes with the tests for it, and
writes one line per run (exit code, counts from the JUnit report, minutes) to
``--out``/summary.json and the console::

    .venv/bin/python -m tests.under_load --times 5 -- \
        tests/chaos tests/integration/test_demo_smoke.py

``make under-load`` runs exactly that. The busy process is stopped by its pid at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

BUSY_LOOP = "while True:\n    pass\n"


def start_busy() -> subprocess.Popen[bytes]:
    """A process spinning on the machine's last core (the whole machine without taskset)."""
    argv = [sys.executable, "-c", BUSY_LOOP]
    core = (os.cpu_count() or 1) - 1
    if shutil.which("taskset") and core > 0:
        argv = ["taskset", "-c", str(core), *argv]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL)


def junit_counts(path: Path) -> dict[str, Any]:
    """tests/failures/errors/skipped and the failing test ids from a pytest JUnit report."""
    if not path.exists():
        return {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": ["(no report)"]}
    root = ET.parse(path).getroot()  # noqa: S314 (pytest's own report, written just now)
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {
        **{k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")},
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("out/under_load"))
    parser.add_argument("pytest_args", nargs="+", help="what pytest runs (after --)")
    args = parser.parse_args(argv)
    # Started as `cmd &` by a script, SIGINT arrives ignored and every test process would inherit
    # that (tests stop producers with SIGINT): give the runs the disposition of a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    args.out.mkdir(parents=True, exist_ok=True)
    busy = start_busy()
    runs: list[dict[str, Any]] = []
    try:
        for i in range(1, args.times + 1):
            report = args.out / f"run-{i}.xml"
            started = time.monotonic()
            code = subprocess.call(
                [sys.executable, "-m", "pytest", "-q", f"--junitxml={report}", *args.pytest_args]
            )
            run = {
                "run": i,
                "exit": code,
                "minutes": round((time.monotonic() - started) / 60, 1),
                **junit_counts(report),
            }
            runs.append(run)
            print(f"under load, run {i}/{args.times}: {json.dumps(run)}", flush=True)
    finally:
        busy.terminate()
        busy.wait(10)
    summary = {
        "pytest_args": args.pytest_args,
        "busy": "one spinning process pinned to the last core",
        "cpus": os.cpu_count(),
        "runs": runs,
        "all_green": all(r["exit"] == 0 for r in runs),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if summary["all_green"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
