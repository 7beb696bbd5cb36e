"""SIGKILL of a committing process at each step of a Delta batch commit, then the commit re-run.

A child process plays both roles for one batch: it writes the batch's Parquet files (the
executors' part), then commits them (the driver's part), and SIGKILLs itself at one point:

* ``staged``    — the Parquet files are written, the commit has not started;
* ``checked``   — the commit checked the table and the files, the Delta commit has not happened;
* ``committed`` — the Delta commit is done, the checkpoint after it not yet.

The kill is the child's own ``os.kill(getpid(), SIGKILL)`` at that point, so where it dies is
deterministic. Then the batch is re-run, either the driver's commit alone (with the commit
messages the tasks had returned) or the whole batch (tasks and commit, as Spark does after a
restart), and the table must hold every batch exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pidfence.spark_sink.readers import read_log as read_delta_log
from tests.unit.delta_kit import commit_batch, data_dir
from tests.unit.test_delta_commit import Q, expected, run_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, signal, sys
from tests.unit.delta_kit import commit_batch
from tests.unit.test_delta_commit import Q, stage

path, batch, point, messages = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
files = stage(path, batch)
with open(messages, "w") as out:
    json.dump(files, out)

def die(at, attempt=0):
    if at == point:
        os.kill(os.getpid(), signal.SIGKILL)

die("staged")
commit_batch(path, "log", Q, batch, files, hook=die)
"""

POINTS = ("staged", "checked", "committed")


def _child(code: str, *args: object, timeout: int) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``args`` in a fresh Python that imports this checkout and its tests."""
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def _killed_run(path: Path, batch: int, point: str, messages: Path) -> None:
    proc = _child(CHILD, path, batch, point, messages, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def _added_files(path: Path) -> list[str]:
    return sorted(pa.table(DeltaTable(str(path)).get_add_actions()).column("path").to_pylist())


def _assert_exact(path: Path, batches: list[int]) -> None:
    assert read_delta_log(str(path)).equals(expected(batches))
    assert DeltaTable(str(path)).transaction_version(Q) == max(batches)
    files = _added_files(path)
    assert len(files) == len(set(files)) == 2 * len(batches)


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("rerun", ["commit", "batch"])
def test_kill_at_each_commit_step_then_rerun(tmp_path: Path, point: str, rerun: str) -> None:
    run_batch(str(tmp_path), 0)
    messages = tmp_path.parent / f"{tmp_path.name}-messages.json"
    _killed_run(tmp_path, 1, point, messages)

    committed = point == "committed"
    # What readers see right after the crash: batch 1 entirely or not at all.
    _assert_exact(tmp_path, [0, 1] if committed else [0])
    assert len(list((tmp_path / data_dir(Q, 1)).glob("*.parquet"))) == 2

    if rerun == "commit":
        files = [(rel, stats) for rel, stats in json.loads(messages.read_text())]
        assert commit_batch(str(tmp_path), "log", Q, 1, files) is not committed
    else:
        assert run_batch(str(tmp_path), 1) is not committed
    _assert_exact(tmp_path, [0, 1])
    # A second re-run is a no-op, and the next batch continues normally.
    assert not run_batch(str(tmp_path), 1)
    assert run_batch(str(tmp_path), 2)
    _assert_exact(tmp_path, [0, 1, 2])


def test_kill_at_every_step_in_one_run(tmp_path: Path) -> None:
    """Batches 1-3 each die at a different step and are re-run by a fresh process."""
    run_batch(str(tmp_path), 0)
    for batch, point in enumerate(POINTS, start=1):
        _killed_run(tmp_path, batch, point, tmp_path.parent / f"{tmp_path.name}-{batch}.json")
        _clean_run(tmp_path, batch, tmp_path.parent / f"{tmp_path.name}-r{batch}.json")
    _assert_exact(tmp_path, [0, 1, 2, 3])


def _clean_run(path: Path, batch: int, messages: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(batch), "never", str(messages)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
        check=True,
        timeout=120,
    )


# --------------------------------------------------------------------------------------------
# The sink's real writer, SIGKILLed at each step of a batch.

SINK_CHILD = """
import os, signal, sys
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.crash_points import install_hook
from pidfence.spark_sink.output import open_output
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.writer import PidfenceStreamWriter
from tests.integration.test_delta_crash import SINK_QUERY, sink_chunks
from tests.unit.test_delta_layout import SETTINGS
from tests.unit.test_sink_process import kafka_rows

path, start, kill_batch, point = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
options = SinkOptions.parse({"path": path, **SETTINGS})
open_output(options.path, options.rejects_path, SINK_QUERY)

def die(at, attempt=0):
    if at == point:
        os.kill(os.getpid(), signal.SIGKILL)

w = PidfenceStreamWriter(options, SINK_QUERY)
for batch, chunk in enumerate(sink_chunks()):
    if batch < start:
        continue
    armed = batch == kill_batch
    install_hook(die if armed else None)
    writer_mod._task_context = lambda: (batch, 0, SINK_QUERY)
    message = w.write(iter(kafka_rows(chunk).to_batches(max_chunksize=17)))
    if armed:
        die("after_write")
    w.commit([message], batch)
    if armed:
        die("after_commit")
"""

SINK_QUERY = "5b6c7d8e-delta-sink"


def sink_chunks() -> list[list[tuple[int, bytes | None, int]]]:
    """The stream the sink children process, cut into batches the same way every run."""
    from tests.unit.test_sink_process import make_stream

    records = make_stream(23, 480)
    return [records[i : i + 40] for i in range(0, len(records), 40)]


def _sink_child(path: Path, start: int, kill_batch: int, point: str) -> int:
    proc = _child(SINK_CHILD, path, start, kill_batch, point, timeout=300)
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
    return proc.returncode


def test_sink_on_delta_killed_at_each_step_restarts_exact(tmp_path: Path) -> None:
    """Kill after write() (before commit), between the rejects and the log commit, after the
    commit (before Spark's commit log): each restart re-runs the batch it died in, as Spark does
    from its checkpoint. The Delta tables, read by deltalake alone, are exactly the rules'."""
    from tests.unit.test_delta_layout import RULES
    from tests.unit.test_sink_process import reference

    plan = [(0, 2, "after_write"), (2, 5, "rejects_committed"), (5, 8, "after_commit")]
    for start, kill_batch, point in plan:
        assert _sink_child(tmp_path, start, kill_batch, point) == -signal.SIGKILL
        log = DeltaTable(str(tmp_path))
        committed = log.transaction_version(SINK_QUERY)
        # Died before the commit point: the batch is not in the log; after it: it is.
        assert committed == (kill_batch if point == "after_commit" else kill_batch - 1)
    assert _sink_child(tmp_path, 8, -1, "never") == 0

    records = [r for chunk in sink_chunks() for r in chunk]
    expected, dropped = reference(records, **RULES)
    log_rows = DeltaTable(str(tmp_path)).to_pyarrow_table().sort_by("log_offset")
    assert log_rows["offset"].to_pylist() == expected
    assert log_rows["log_offset"].to_pylist() == list(range(len(expected)))
    rejects = DeltaTable(str(tmp_path / "_rejects")).to_pyarrow_table()
    offsets = rejects["offset"].to_pylist()
    assert len(offsets) == len(set(offsets))
    assert dict(zip(offsets, rejects["verdict"].to_pylist(), strict=True)) == dropped
    assert DeltaTable(str(tmp_path)).transaction_version(SINK_QUERY) == len(sink_chunks()) - 1
