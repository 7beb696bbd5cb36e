"""A server node's wait for readiness (a shell process stands in for the JVM)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from pidfence.services import ServiceFailed, process, started_pids
from pidfence.services.node import ServerNode


def _node(tmp_path: Path, script: str) -> ServerNode:
    cmd = ["sh", "-c", script]
    return ServerNode("kafka-0", cmd, tmp_path / "kafka.log", lambda: False, "Kafka", 9092)


def test_a_node_that_exits_at_start_fails_its_wait_at_once_with_its_log(tmp_path: Path) -> None:
    node = _node(tmp_path, "echo 'port 9092 is in use'; exit 3")
    node.start()
    began = time.monotonic()
    try:
        with pytest.raises(ServiceFailed, match=r"(?s)exited with code 3.*port 9092 is in use"):
            node.wait_ready(timeout=600)
        assert time.monotonic() - began < 300  # it did not wait the timeout out
    finally:
        node.stop()


def test_a_process_that_exited_on_its_own_is_not_reported_alive_when_its_pid_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's end check asks each process through its own handle: a pid reused by another
    process (pids wrap on a long run) is not a process the suite left running."""
    node = _node(tmp_path, "exit 0")
    node.start()
    pid = node.pid
    assert pid is not None
    while node.running:
        time.sleep(0.01)
    # Another process now holds the pid, as a later one may on a long run.
    monkeypatch.setattr(process, "pid_alive", lambda _pid: True)
    assert pid not in started_pids()


def test_a_node_not_ready_in_time_reports_its_log_as_it_is_then(tmp_path: Path) -> None:
    node = _node(tmp_path, "sleep 0.3; echo 'still electing a controller'; sleep 30")
    node.start()
    try:
        with pytest.raises(ServiceFailed, match=r"(?s)not ready after 1s.*still electing"):
            node.wait_ready(timeout=1.0, interval=0.1)
    finally:
        node.stop()


def test_a_process_that_stopped_itself_is_stopped_by_sigterm_not_waited_out(tmp_path: Path) -> None:
    # A producer run with --stop-after-checkpoint sends itself SIGSTOP; SIGTERM alone stays
    # pending on a stopped process, so stop() would wait its whole timeout and then SIGKILL.
    code = "import os, signal, time; os.kill(os.getpid(), signal.SIGSTOP); time.sleep(60)"
    proc = process.ManagedProcess("self-stopped", [sys.executable, "-c", code], tmp_path / "p.log")
    proc.start()
    process.wait_until(lambda: _state(proc.pid) == "T", 10, "the process to stop itself")
    proc.stop(timeout=5)
    assert proc.exit_code() == -signal.SIGTERM


def _state(pid: int | None) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]
