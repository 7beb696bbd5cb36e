"""``pidfence sink`` as a newcomer meets it, driven as a subprocess: each failure is one clear
line and a documented exit code within 15 s, and a run's console carries no JVM line."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pidfence.cli.exits import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from pidfence.services import free_port
from tests.fixtures.commands import sink_args, stderr_lines, timed_pidfence

pytestmark = pytest.mark.timeout(300)

#: What the JVM, Spark or py4j print when they reach the console.
JVM_LINE = re.compile(
    r"\b(WARN|INFO|ERROR|DEBUG)\b|log4j|WARNING: Using incubator|NativeCodeLoader|"
    r"^\s+at [\w.$]+\(|Exception|py4j|SparkContext|Ivy|:: loading settings",
    re.MULTILINE,
)


def run_sink(*args: str, timeout: float = 240.0) -> tuple[subprocess.CompletedProcess[str], float]:
    """``pidfence sink ARGS`` in a subprocess; (result, seconds it took)."""
    return timed_pidfence("sink", *args, timeout=timeout)


def paths(tmp_path: Path) -> list[str]:
    return ["--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ckpt")]


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    lines = stderr_lines(result.stderr)
    assert result.returncode == code, result.stderr + result.stdout
    assert len(lines) == 1, result.stderr
    assert result.stdout.strip() == ""
    for word in words:
        assert word in lines[0]
    assert not JVM_LINE.search(result.stderr), result.stderr


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_kafka_down_is_one_line_and_exit_3_within_15_s(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # a port nothing listens on
    result, took = run_sink(
        "--bootstrap", dead, "--topic", "raw", *paths(tmp_path), "--available-now"
    )
    assert_one_line(result, EXIT_UNAVAILABLE, "cannot reach Kafka", dead)
    assert took < 15, f"took {took:.1f}s"


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_missing_topic_is_one_line_and_exit_3_within_15_s(kafka: Any, tmp_path: Path) -> None:
    result, took = run_sink(
        "--bootstrap",
        kafka.bootstrap,
        "--topic",
        "no-such-topic-here",
        *paths(tmp_path),
        "--available-now",
    )
    assert_one_line(result, EXIT_UNAVAILABLE, "'no-such-topic-here' does not exist")
    assert took < 15, f"took {took:.1f}s"


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody (root included) can create files in: ``chattr +i`` as root, else 0555."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"chattr +i unavailable here: {done.stderr!r}")
        try:
            yield folder
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=False)
    else:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_read_only_output_path_is_one_line_and_exit_3_within_15_s(
    kafka: Any, new_topic: Any, read_only_dir: Path, tmp_path: Path
) -> None:
    topic = new_topic()
    out = read_only_dir / "log"
    result, took = run_sink(
        *sink_args(kafka.bootstrap, topic, out, tmp_path / "ckpt"),
    )
    assert_one_line(result, EXIT_UNAVAILABLE, f"output {out} is not writable")
    assert took < 15, f"took {took:.1f}s"


def test_output_path_that_is_a_file_is_one_line_and_exit_3(
    kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic()
    (tmp_path / "file").write_text("x")
    result, _ = run_sink(
        *sink_args(kafka.bootstrap, topic, tmp_path / "file", tmp_path / "ckpt"),
    )
    assert_one_line(result, EXIT_UNAVAILABLE, "is a file, not a folder")


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_bad_option_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result, took = run_sink(
        "--bootstrap", "127.0.0.1:1", "--topic", "raw", *paths(tmp_path), "--lifetime", "soon"
    )
    assert_one_line(result, EXIT_USAGE, "lifetime 'soon'")
    assert took < 15


def test_plain_topic_runs_with_a_warning_human_batch_lines_and_no_jvm_line(
    kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    topic = new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(300):
        producer.produce(topic, value=b"v%d" % i, key=b"k%d" % (i % 7))
    assert producer.flush(30) == 0
    result, _ = run_sink(
        *sink_args(kafka.bootstrap, topic, tmp_path / "out", tmp_path / "ckpt"),
        "--master",
        "local[2]",
    )
    assert result.returncode == EXIT_OK, result.stderr + result.stdout
    warning = stderr_lines(result.stderr)
    assert len(warning) == 1 and "has a `pf` header" in warning[0], result.stderr
    out = result.stdout
    assert re.search(r"^batch 0: 300 in → 300 appended, 0 dropped, lag 0, [\d.]+ s$", out, re.M), (
        out
    )
    assert "committed 1 batch(es): 300 in → 300 appended, 0 dropped" in out
    assert not JVM_LINE.search(out + result.stderr), out + result.stderr
    logs = list((tmp_path / "ckpt" / "logs").glob("spark-*.log"))
    assert len(logs) == 1 and f"Spark and JVM log: {logs[0]}" in out
    assert "WARN" in logs[0].read_text()  # Spark did log, to the file


def test_spark_failure_is_one_line_with_the_log_path(
    kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic()
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic, value=b"v")
    assert producer.flush(30) == 0
    # A checkpoint that Spark cannot parse: the query fails inside the JVM.
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "metadata").write_text("not json\n")
    result, _ = run_sink(
        *sink_args(kafka.bootstrap, topic, tmp_path / "out", tmp_path / "ckpt"),
        "--master",
        "local[1]",
    )
    lines = stderr_lines(result.stderr)
    assert result.returncode == EXIT_UNAVAILABLE, result.stderr  # it failed at the start
    assert len(lines) == 2 and "has a `pf` header" in lines[0], result.stderr
    assert lines[1].startswith("pidfence sink: "), lines
    log = next((tmp_path / "ckpt" / "logs").glob("spark-*.log"))
    assert f"(details in {log})" in lines[1]


def test_another_writers_delta_table_is_refused_at_start_with_exit_3_and_left_alone(
    kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    topic = new_topic()
    out = tmp_path / "out"
    write_deltalake(str(out), pa.table({"topic": ["x"], "value": [b"v"]}))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    result, _ = run_sink(
        "--bootstrap", kafka.bootstrap, "--topic", topic, *paths(tmp_path), "--available-now"
    )
    assert_one_line(
        result, EXIT_UNAVAILABLE, f"{out} is a Delta table that pidfence did not create"
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert DeltaTable(str(out)).version() == 0


def test_missing_options_are_one_line_and_exit_2(tmp_path: Path) -> None:
    result, _ = run_sink("--topic", "raw", *paths(tmp_path))
    assert_one_line(result, EXIT_USAGE, "missing option --bootstrap")


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_a_table_of_another_format_is_refused_in_one_line(
    kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    from pidfence.spark_sink.delta.table import DELTA_LOG_SCHEMA, FORMAT_KEY, TABLE_KEY

    topic = new_topic()
    out = tmp_path / "out"
    DeltaTable.create(
        str(out),
        DELTA_LOG_SCHEMA,
        configuration={TABLE_KEY: "log", FORMAT_KEY: "1"},
        raise_if_key_not_exists=False,
    )
    result, took = run_sink(
        "--bootstrap", kafka.bootstrap, "--topic", topic, *paths(tmp_path), "--available-now"
    )
    assert_one_line(result, EXIT_UNAVAILABLE, f"{out} has pidfence table format '1'")
    assert took < 15, f"took {took:.1f}s"
    assert DeltaTable(str(out)).version() == 0
