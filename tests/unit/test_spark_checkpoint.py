"""What the sink reads from Spark's checkpoint: whether it committed a batch, and where the next
run starts, from files laid out as Spark writes them."""

from __future__ import annotations

import json
from pathlib import Path

from pidfence.spark_sink.spark_checkpoint import checkpoint_committed, start_offsets

MARKS = {("t", 0): (5, 100), ("t", 1): (0, 50)}
#: The line Spark writes before a batch's source offsets: its watermark, clock and session conf.
BATCH_METADATA = json.dumps(
    {
        "batchWatermarkMs": 0,
        "batchTimestampMs": 1_700_000_000_000,
        "conf": {
            "spark.sql.shuffle.partitions": "200",
            "spark.sql.streaming.multipleWatermarkPolicy": "min",
        },
    }
)


def _planned(checkpoint: Path, batch: int, offsets: dict[str, dict[str, int]]) -> None:
    (checkpoint / "offsets").mkdir(exist_ok=True)
    text = f"v1\n{BATCH_METADATA}\n{json.dumps(offsets)}\n"
    (checkpoint / "offsets" / str(batch)).write_text(text)


def _committed(checkpoint: Path, batch: int) -> None:
    (checkpoint / "commits").mkdir(exist_ok=True)
    (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_the_next_run_starts_after_the_newest_committed_batch(tmp_path: Path) -> None:
    for batch, offsets in enumerate([{"0": 40, "1": 20}, {"0": 60, "1": 30}, {"0": 90}]):
        _planned(tmp_path, batch, {"t": offsets})
    _committed(tmp_path, 0)
    _committed(tmp_path, 1)  # batch 2 planned, not committed
    assert start_offsets(str(tmp_path), MARKS, "earliest") == {("t", 0): 60, ("t", 1): 30}


def test_the_session_conf_in_a_batchs_offsets_file_is_not_read_as_offsets(
    tmp_path: Path,
) -> None:
    _planned(tmp_path, 0, {"t": {"0": 40}})
    _committed(tmp_path, 0)
    assert start_offsets(str(tmp_path), MARKS, "latest") == {("t", 0): 40, ("t", 1): 50}


def test_only_a_commit_file_is_a_committed_batch(tmp_path: Path) -> None:
    assert not checkpoint_committed(None)
    assert not checkpoint_committed(str(tmp_path))
    commits = tmp_path / "commits"
    commits.mkdir()
    # What a run killed while writing its first commit leaves: Spark's temporary file.
    (commits / ".0.6f1c2e7a-3b1d-4c55-9d1e-2f0a8b7c6d5e.tmp").write_text("v1\n")
    assert not checkpoint_committed(str(tmp_path))
    _committed(tmp_path, 0)
    assert checkpoint_committed(str(tmp_path))
