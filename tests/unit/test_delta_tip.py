"""An aged output's tasks never list ``_delta_log/``: a batch's cost does not grow with the log.

A Delta log keeps every commit for its log retention; deltalake lists the whole folder on every
load or update on a local disk. The test ages a log (thousands of older commits and
checkpoints), then plants a tripwire in it that makes any listing fail (a symlink loop: the
local object store walks it and stops), and runs the tasks' side of batches with the driver's
commits in between (these list, through deltalake: the tripwire is lifted for them).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.delta.commit import commit_files
from pidfence.spark_sink.delta.table import (
    FORMAT_KEY,
    FORMAT_VERSION,
    TABLE_KEY,
    open_table,
    schema_of,
)
from pidfence.spark_sink.delta.tip import query_tip
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.storage import Store
from pidfence.spark_sink.writer import PidfenceStreamWriter
from tests.unit.test_delta_layout import QUERY, SETTINGS
from tests.unit.test_sink_process import kafka_rows, make_stream

#: Older commits the aged log keeps (a checkpoint every 10): an hour at one commit a second.
AGED = 3_600


def _age(log: Path) -> None:
    """Give ``log`` entries for versions below its oldest one: links to a real commit and a
    real checkpoint (nothing reads below the newest checkpoint; a listing sees every name)."""
    names = sorted(p.name for p in log.iterdir() if p.name[:20].isdigit())
    oldest = int(names[0][:20])
    sample = log / names[-1]
    checkpoint = next(log.glob("*.checkpoint.parquet"))
    shift = AGED
    for name in sorted(names, reverse=True):
        (log / name).rename(log / f"{int(name[:20]) + shift:020d}{name[20:]}")
    last = json.loads((log / "_last_checkpoint").read_text())
    last["version"] += shift
    (log / "_last_checkpoint").write_text(json.dumps(last))
    sample, checkpoint = (
        log / f"{int(p.name[:20]) + shift:020d}{p.name[20:]}" for p in (sample, checkpoint)
    )
    for version in range(oldest, oldest + shift):
        os.link(sample, log / f"{version:020d}.json")
        if version % 10 == 0:
            os.link(checkpoint, log / f"{version:020d}.checkpoint.parquet")


class Tripwire:
    """A symlink loop in a folder: any listing of it fails while planted."""

    def __init__(self, folder: Path) -> None:
        self.link = folder / "zz-tripwire"

    def plant(self) -> None:
        os.symlink(".", self.link)

    def lift(self) -> None:
        self.link.unlink()


def test_an_aged_logs_tasks_read_commits_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "out"
    options = SinkOptions.parse({"path": str(root), **SETTINGS})
    writer = PidfenceStreamWriter(options)
    records = make_stream(5, 400)

    def batch(batch_id: int, tripwire: Tripwire | None) -> None:
        monkeypatch.setattr(writer_mod, "_task_context", lambda: (batch_id, 0, QUERY))
        chunk = records[batch_id * 20 : batch_id * 20 + 20]
        if tripwire is not None:
            tripwire.plant()
        message = writer.write(iter(kafka_rows(chunk).to_batches()))
        if tripwire is not None:
            tripwire.lift()
        writer.commit([message], batch_id)

    for batch_id in range(12):
        batch(batch_id, None)
    log = root / "_delta_log"
    _age(log)
    tripwire = Tripwire(log)
    for batch_id in range(12, 20):
        batch(batch_id, tripwire)
    tripwire.plant()
    output = Output(str(root), str(root / "_rejects"), QUERY)
    assert output.committed_version() == 19
    assert output.last_committed_before(20) == 19
    assert set(output.positions(19)) == {"t~0"}
    tripwire.lift()


def test_a_cleaned_or_replaced_log_is_read_again(tmp_path: Path) -> None:
    """Commits removed by log cleanup, or a table replaced, are never skipped: deltalake
    answers then."""
    from pidfence.spark_sink.delta.commit import commit_files
    from pidfence.spark_sink.delta.table import open_table
    from pidfence.spark_sink.schema import LOG_SCHEMA
    from tests.unit.delta_kit import stage_file

    root = tmp_path / "t"
    table = Store.at(str(root))
    dt = open_table(str(root), "log")
    loads: list[Any] = []

    def load() -> Any:
        loads.append(1)
        return dt

    def commit(batch_id: int, query: str = QUERY) -> None:
        rows = LOG_SCHEMA.empty_table()
        staged = stage_file(str(root), "log", query, batch_id, "t", 0, rows)
        commit_files(table, "log", query, batch_id, [staged])
        dt.update_incremental()

    commit(0)
    assert query_tip(table, QUERY, load).txn == 0
    for batch_id in range(1, 4):
        commit(batch_id)
        assert query_tip(table, QUERY, load).txn == batch_id
    commit(0, "another-query")
    assert query_tip(table, QUERY, load).txn == 3
    assert len(loads) == 1
    # A checkpoint past the known version, and the commits before it cleaned up.
    for batch_id in range(4, 13):
        commit(batch_id)
    dt.create_checkpoint()
    for path in (root / "_delta_log").glob("*.json"):
        if int(path.name[:20]) < dt.version():
            path.unlink()
    assert query_tip(table, QUERY, load).txn == 12
    assert len(loads) == 2
    # The table replaced by a new one.
    shutil.rmtree(root)
    dt = open_table(str(root), "log")
    assert query_tip(table, QUERY, load).txn is None
    assert len(loads) == 3


def test_a_table_replaced_in_place_is_known_by_its_new_id(tmp_path: Path) -> None:
    """A CREATE OR REPLACE commits the new table's id in a commit that is read by name: the
    tip (and what a process keeps by table id, such as the partitions' positions) follows it."""
    root = str(tmp_path / "t")
    table = Store.at(root)
    open_table(root, "log")
    commit_files(table, "log", QUERY, 0, [])

    def load() -> DeltaTable:
        return DeltaTable(root)

    before = query_tip(table, QUERY, load)
    DeltaTable.create(
        root,
        schema_of("log"),
        mode="overwrite",
        configuration={TABLE_KEY: "log", FORMAT_KEY: FORMAT_VERSION},
        raise_if_key_not_exists=False,
    )
    after = query_tip(table, QUERY, load)
    assert after.version == before.version + 1
    new_id = str(DeltaTable(root).metadata().id)
    assert after.table_id == new_id
    assert before.table_id != new_id
