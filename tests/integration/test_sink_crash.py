"""``pidfence sink`` as a driver process: task retries, SIGKILL at each commit step, a cluster.

Each crash run SIGKILLs the sink's whole process group (driver, JVM, Python workers) at one point
of the commit protocol (``pidfence.spark_sink.crash_points``), run through ``python -m
pidfence.testing.run --crash-at POINT``; the next run (plain ``pidfence sink``) restarts from the
checkpoint.
The output log must equal the expected one exactly after every restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pidfence.cli.exits import EXIT_RETRIABLE
from pidfence.demo.procs import sink_argv
from pidfence.services.process import track
from pidfence.spark_sink import read_log, read_rejects
from pidfence.spark_sink.output import Output
from pidfence.testing import run_argv
from tests.integration.test_sink import (
    LOG1,
    LOG2,
    LOG3,
    REJECTS1,
    REJECTS2,
    REJECTS3,
    RUN1,
    RUN2,
    RUN3,
    assert_output,
    expected_log,
    expected_rejects,
    produce,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

#: Generous bound for one Spark driver run on a busy 2-core machine (not a timed assertion).
RUN_LIMIT_S = 400.0


class SinkProc:
    """One ``pidfence sink`` subprocess in its own session, its output in a log file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = track(
            subprocess.Popen(
                argv,
                stdout=self._out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        )

    def wait(self, timeout: float = RUN_LIMIT_S) -> int:
        """Exit code (negative: killed by that signal); kills the group if it overruns."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        finally:
            self._out.close()

    def kill(self) -> None:
        """SIGKILL the process group this test started (the child leads it)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def text(self) -> str:
        """Everything the process printed so far."""
        return self.log.read_text(errors="replace")


def run_cli(
    tmp: Path, name: str, argv: list[str], env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run the sink to its end; (exit code, output).

    Exit 75 says that running the same command again continues (e.g. Spark's JVM did not start
    in time on a loaded machine, a Kafka request timed out): the command then runs once more, as
    a supervisor would, and the output of both runs is returned.
    """
    texts: list[str] = []
    for attempt in range(2):
        proc = SinkProc(argv, tmp / f"{name}{'.rerun' * attempt}.log", env)
        try:
            code = proc.wait()
        finally:
            proc.kill()
        texts.append(proc.text())
        if code != EXIT_RETRIABLE:
            break
    return code, "\n".join(texts)


def committed(output: Path, batch: int) -> bool:
    """Whether the sink committed the batch (its manifest; for Delta, the log table's
    transaction id)."""
    return batch in Output.reading(str(output)).committed_ids()


@pytest.mark.slow  # over a minute: handed out first under xdist (tests/README.md)
def test_task_retry_and_sigkill_at_each_commit_step_keep_the_log_exact(
    kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    argv = sink_argv(
        kafka.bootstrap,
        topic,
        out,
        ckpt,
        ["--master", "local[2,3]", "--no-resolve-gaps"],
    )

    # Every task's first attempt fails; Spark retries it and the log is still exact.
    sent = produce(kafka.bootstrap, topic, RUN1)
    code, text = run_cli(tmp_path, "retry", run_argv(argv, fail_first_attempt=True))
    assert code == 0, text
    # Spark's own output (the failed attempt's traceback) goes to the run's log file.
    spark_logs = "".join(f.read_text(errors="replace") for f in (ckpt / "logs").glob("*.log"))
    assert "injected failure of task attempt 0" in text + spark_logs
    assert "batch 0: 21 in → 12 appended" in text
    assert_output(out, topic, sent, [LOG1], REJECTS1)
    assert (out / "_delta_log").is_dir()

    # Batch 1, SIGKILLed after write(), then between the data files and the two Delta commits:
    # never visible.
    produce(kafka.bootstrap, topic, RUN2, sent)
    for point in ("after_write", "before_manifest"):
        code, text = run_cli(tmp_path, point, run_argv(argv, crash_at=point))
        assert code == -signal.SIGKILL, text
        assert not committed(out, 1)
        assert_output(out, topic, sent, [LOG1], REJECTS1)

    # Between the rejects table's commit and the log table's (the commit point): the log has
    # nothing of batch 1; its rejects are committed already (the re-run's rejects commit is a
    # no-op under the same transaction id).
    code, text = run_cli(
        tmp_path, "rejects_committed", run_argv(argv, crash_at="rejects_committed")
    )
    assert code == -signal.SIGKILL, text
    assert not committed(out, 1)
    assert read_log(str(out)).to_pylist() == expected_log(topic, sent, [LOG1])
    assert read_rejects(str(out)).to_pylist() == expected_rejects(topic, sent, REJECTS1 | REJECTS2)

    # After the commit point, before Spark's commit log: committed for the sink only.
    code, text = run_cli(tmp_path, "after_manifest", run_argv(argv, crash_at="after_manifest"))
    assert code == -signal.SIGKILL, text
    assert committed(out, 1) and not (ckpt / "commits" / "1").exists()
    assert_output(out, topic, sent, [LOG1, LOG2], REJECTS1 | REJECTS2)

    # A clean restart re-runs batch 1 (no new entries) and then reads what came since.
    produce(kafka.bootstrap, topic, RUN3, sent)
    code, text = run_cli(tmp_path, "clean", argv)
    assert code == 0, text
    assert (ckpt / "commits" / "1").exists()
    assert_output(out, topic, sent, [LOG1, LOG2, LOG3], REJECTS1 | REJECTS2 | REJECTS3)
    # One Delta commit per batch in each table, whatever died on the way.
    from deltalake import DeltaTable

    log_ops = [h["operation"] for h in DeltaTable(str(out)).history()]
    assert log_ops.count("WRITE") == len(Output.reading(str(out)).committed_ids())
    assert not list((out / "_pidfence" / "data").rglob("*.parquet"))  # no staged leftovers


def test_cli_on_standalone_cluster_runs_until_sigterm(
    kafka: Any, new_topic: Any, spark_standalone: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    sent = produce(kafka.bootstrap, topic, RUN1)
    argv = sink_argv(
        kafka.bootstrap,
        topic,
        out,
        ckpt,
        [
            "--master",
            spark_standalone.master_url,
            "--no-resolve-gaps",
        ],
    )
    argv = [a for a in argv if a != "--available-now"] + ["--trigger", "1"]
    proc = SinkProc(argv, tmp_path / "standalone.log")
    try:
        _wait_for(proc, lambda: committed(out, 0))
        # The batch ran on the cluster's executors: the master granted the sink's app cores.
        apps = spark_standalone.running_apps()
        assert any(app["cores"] > 0 for app in apps), apps
        produce(kafka.bootstrap, topic, RUN2, sent)
        _wait_for(proc, lambda: read_log(str(out)).num_rows == 15)
        # RUN2 may span batches; wait until the newest committed one is printed.
        last = max(Output.reading(str(out)).committed_ids())
        _wait_for(proc, lambda: f"batch {last}: " in proc.text())
        proc.proc.send_signal(signal.SIGTERM)
        code = proc.wait()
    finally:
        proc.kill()
    text = proc.text()
    assert code == 0, text
    assert "SIGTERM: stopping" in text
    assert "batch 0: 21 in → 12 appended" in text
    assert_output(out, topic, sent, [LOG1, LOG2], REJECTS1 | REJECTS2)


def _wait_for(proc: SinkProc, done: Any) -> None:
    deadline = time.monotonic() + RUN_LIMIT_S
    while not done():
        assert proc.proc.poll() is None, proc.text()
        assert time.monotonic() < deadline, proc.text()
        time.sleep(0.5)
