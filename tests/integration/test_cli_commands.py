"""Every command's exit codes from the README's table, driven as a subprocess: one clear line on
stderr and the documented code (the sink's and the services' cases have files of their own)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pidfence.cli.exits import (
    EXIT_RETRIABLE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from pidfence.services import free_port
from tests.fixtures.commands import timed_pidfence

pytestmark = pytest.mark.timeout(600)


def pidfence(*args: str, timeout: float = 120.0) -> tuple[subprocess.CompletedProcess[str], float]:
    return timed_pidfence(*args, timeout=timeout)


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert lines, result.stdout
    return lines[-1]


def dead() -> str:
    return f"127.0.0.1:{free_port()}"


def test_bench_unknown_name_is_usage() -> None:
    result, _ = pidfence("bench", "no-such-bench")
    assert result.returncode == EXIT_USAGE
    assert "no benchmark 'no-such-bench'" in last_line(result)


def test_verify_missing_ledger_is_usage(tmp_path: Path) -> None:
    result, _ = pidfence(
        "verify", "--ledger", str(tmp_path / "none.jsonl"), "--output", str(tmp_path)
    )
    assert result.returncode == EXIT_USAGE
    assert "does not exist" in last_line(result)


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_produce_without_a_lease_server_is_retriable(tmp_path: Path) -> None:
    result, took = pidfence(
        "produce",
        "--bootstrap",
        dead(),
        "--lease-server",
        dead(),
        "--topic",
        "raw",
        "--count",
        "10",
        "--state",  # a rerun continues from it: without one a rerun would start over (exit 3)
        str(tmp_path / "produce.json"),
    )
    assert result.returncode == EXIT_RETRIABLE
    assert last_line(result).startswith("pidfence: retriable: ")
    assert took < 15


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_copy_without_a_lease_server_is_retriable(
    kafka: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Kafka answers and the topics exist, so what fails is the lease server, and it is named."""
    gone = dead()
    result, took = pidfence(
        "copy",
        "--bootstrap",
        kafka.bootstrap,
        "--lease-server",
        gone,
        "--from-topic",
        new_topic(),
        "--to-topic",
        new_topic(),
        "--state",
        str(tmp_path / "s.json"),
    )
    assert result.returncode == EXIT_RETRIABLE
    assert last_line(result).startswith("pidfence: retriable: LeaseServerDown: ")
    assert gone in last_line(result)
    assert took < 15


def test_copy_with_kafka_down_is_retriable_with_one_librdkafka_line(tmp_path: Path) -> None:
    """librdkafka retries a refused connect every 100 ms or so; the user sees it once, then the
    verdict (about 150 lines before)."""
    gone = dead()
    result, _ = pidfence(
        "copy",
        "--bootstrap",
        gone,
        "--lease-server",
        dead(),
        "--from-topic",
        "a",
        "--to-topic",
        "b",
        "--state",
        str(tmp_path / "s.json"),
    )
    assert result.returncode == EXIT_RETRIABLE
    assert last_line(result).startswith("pidfence: retriable: BrokerUnavailable: ")
    assert result.stderr.count("Connection refused") <= 2, result.stderr  # line + verdict


def test_produce_to_a_missing_topic_is_exit_3(kafka: Any, zk_chroot: str, tmp_path: Path) -> None:
    from pidfence.services.lease_server import spawn_lease_server

    server = spawn_lease_server(zk_chroot, tmp_path, name="lease")
    try:
        server.wait_listening()
        result, _ = pidfence(
            "produce",
            "--bootstrap",
            kafka.bootstrap,
            "--lease-server",
            server.address,
            "--topic",
            "no-such-topic",
            "--count",
            "1",
        )
    finally:
        server.stop()
    assert "does not exist" in last_line(result)
    assert result.returncode == EXIT_UNAVAILABLE


def test_lease_server_without_zookeeper_is_exit_3(tmp_path: Path) -> None:
    result, _ = pidfence("lease-server", "--zk", dead(), "--listen", f"127.0.0.1:{free_port()}")
    assert result.returncode == EXIT_UNAVAILABLE
    assert "cannot reach ZooKeeper" in last_line(result)
    # Nothing listens there: the refusal is the answer, not kazoo's 15 s session wait.
    assert "every server refused the connection for 3 s" in last_line(result)


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_demo_bad_option_is_usage(tmp_path: Path) -> None:
    result, took = pidfence("demo", "--records", "5", "--out", str(tmp_path))
    assert result.returncode == EXIT_USAGE
    assert result.stderr.strip().splitlines() == [
        "pidfence demo: error: --records must be >= 100 (faults need room), got 5"
    ]
    assert took < 15


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_demo_with_kafka_down_is_one_line_exit_3_within_15_s(tmp_path: Path) -> None:
    gone = dead()
    result, took = pidfence("demo", "--bootstrap", gone, "--out", str(tmp_path))
    assert result.returncode == EXIT_UNAVAILABLE
    assert result.stderr.strip().splitlines() == [
        f"pidfence demo: error: cannot reach Kafka at {gone}: connection refused for 3 s "
        "(is it running? check --bootstrap)"
    ]
    assert took < 15
