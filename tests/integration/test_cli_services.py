"""``pidfence services`` as a subprocess on real servers: ``up`` twice is "already up" (exit 0),
``status`` names a dead node (exit 3), ``down`` stops by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from pidfence.cli.exits import EXIT_OK, EXIT_UNAVAILABLE
from pidfence.services import same_process
from tests.fixtures.commands import run_pidfence

pytestmark = pytest.mark.timeout(400)


def services(*args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    return run_pidfence("services", *args, timeout=timeout)


def test_up_is_idempotent_and_status_names_a_dead_node(tmp_path: Path) -> None:
    run_dir = ["--run-dir", str(tmp_path / "run")]
    empty = services("status", *run_dir)
    assert empty.returncode == EXIT_UNAVAILABLE
    assert empty.stderr.strip().splitlines() == [
        "pidfence services status: error: no services recorded (start them with "
        "`pidfence services up`)"
    ]
    first = services("up", *run_dir)
    try:
        assert first.returncode == EXIT_OK, first.stderr
        state = json.loads(services("status", "--json", *run_dir).stdout)
        recorded = json.loads((tmp_path / "run" / "state.json").read_text())["nodes"]
        again = services("up", *run_dir)
        assert again.returncode == EXIT_OK, again.stderr
        assert again.stdout.startswith("already up")
        assert json.loads(services("status", "--json", *run_dir).stdout) == state  # nothing new
        other = services("up", "--kafka", "2", *run_dir)
        assert other.returncode == EXIT_UNAVAILABLE
        assert len(other.stderr.strip().splitlines()) == 1

        kafka_pid = state["pids"]["kafka-0"]
        os.kill(kafka_pid, signal.SIGKILL)  # the test's own server, by its recorded pid
        status = services("status", *run_dir)
        assert status.returncode == EXIT_UNAVAILABLE
        assert "DEAD" in status.stdout
        assert status.stderr.strip().splitlines() == [
            f"pidfence services status: error: not running: kafka-0 (pid {kafka_pid}, log "
            f"{tmp_path / 'run' / 'kafka' / 'kafka0' / 'kafka.log'})"
        ]
        partly = services("up", *run_dir)
        assert partly.returncode == EXIT_UNAVAILABLE
        assert "partly down: kafka-0" in partly.stderr
    finally:
        down = services("down", *run_dir)
    assert down.returncode == EXIT_OK, down.stderr
    assert not any(same_process(n["pid"], n["start_time"]) for n in recorded)
    assert services("status", *run_dir).returncode == EXIT_UNAVAILABLE
