"""Property: the sink and its Delta output, under any chunking, crashes at any commit step,
replays, compactions and state loss, commits exactly the per-record rules' output, once."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pidfence.spark_sink import output as output_mod
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.delta.care import compact
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import open_output
from pidfence.spark_sink.writer import PidfenceStreamWriter, SinkCommitMessage
from tests.unit.test_delta_layout import QUERY, RULES, SETTINGS
from tests.unit.test_sink_process import Record, kafka_rows, make_stream, reference

pytestmark = pytest.mark.slow

#: What happens around one batch: a clean commit, a driver that dies before commit(), between
#: the rejects and the log commit, or after the commit (then Spark re-runs the batch); a
#: compaction of both tables before it; every state file lost before it.
EVENTS = (
    "clean",
    "die_before_commit",
    "die_between",
    "rerun_after_commit",
    "compact",
    "lose_state",
)


class Crash(Exception):
    """The driver dies here."""


def _run(
    root: Path, records: list[Record], sizes: list[int], events: list[str]
) -> tuple[DeltaTable, DeltaTable]:
    options = SinkOptions.parse({"path": str(root), **SETTINGS})
    open_output(options.path, options.rejects_path, QUERY)
    mp = pytest.MonkeyPatch()
    real = output_mod.commit_files

    def die_on_log(table: Any, kind: str, *args: Any, **kwargs: Any) -> bool:
        if kind == "log":
            raise Crash(kind)
        return real(table, kind, *args, **kwargs)  # type: ignore[arg-type]

    try:
        w = PidfenceStreamWriter(options)

        def write(batch: int, chunk: list[Record], attempt: int) -> SinkCommitMessage:
            mp.setattr(writer_mod, "_task_context", lambda: (batch, attempt, QUERY))
            return w.write(iter(kafka_rows(chunk).to_batches(max_chunksize=13)))

        pos, batch = 0, 0
        while pos < len(records):
            size = sizes[batch % len(sizes)]
            chunk = records[pos : pos + size]
            event = events[batch % len(events)]
            if event == "compact" and batch:
                compact(str(root))
                compact(str(root / "_rejects"), "rejects")
            if event == "lose_state":
                shutil.rmtree(root / "_pidfence" / "_state", ignore_errors=True)
            msg = write(batch, chunk, 0)
            if event == "die_before_commit":
                msg = write(batch, chunk, 1)
            if event == "die_between":
                mp.setattr(output_mod, "commit_files", die_on_log)
                with pytest.raises(Crash):
                    w.commit([msg], batch)
                mp.setattr(output_mod, "commit_files", real)
                msg = write(batch, chunk, 1)
            w.commit([msg], batch)
            if event == "rerun_after_commit":
                again = write(batch, chunk, 1)
                assert again.committed
                w.commit([again], batch)
            pos += len(chunk)
            batch += 1
    finally:
        mp.undo()
    return DeltaTable(str(root)), DeltaTable(str(root / "_rejects"))


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    events=st.lists(st.sampled_from(EVENTS), min_size=1, max_size=6),
)
# One record per batch, state lost before each: a batch that only held a record (no decisions
# file) must replay as nothing, not fall back to reading the users' table rows.
@example(seed=14609, sizes=[1], events=["lose_state"])
def test_delta_output_is_the_rules_output_exactly_once(
    seed: int, sizes: list[int], events: list[str]
) -> None:
    records = make_stream(seed, 160)
    with tempfile.TemporaryDirectory() as tmp:
        log_table, rejects_table = _run(Path(tmp), records, sizes, events)
        expected, dropped = reference(records, **RULES)
        log = log_table.to_pyarrow_table().sort_by("log_offset")
        assert log["offset"].to_pylist() == expected
        assert log["log_offset"].to_pylist() == list(range(len(expected)))
        rejects = rejects_table.to_pyarrow_table()
        offsets = rejects["offset"].to_pylist()
        assert len(offsets) == len(set(offsets))
        assert dict(zip(offsets, rejects["verdict"].to_pylist(), strict=True)) == dropped
