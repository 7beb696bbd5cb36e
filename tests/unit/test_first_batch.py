"""A new checkpoint's first batch that would skip records fails naming ``startingOffsets``
(issue 43); the real query over Kafka is in tests/integration/test_first_batch.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidfence.spark_sink.first_batch import StartSkipsRecords, check_first_batch
from pidfence.spark_sink.manifest import PartCommit
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.spark_checkpoint import initial_offsets


def _initial(ckpt: Path, offsets: str) -> None:
    """What Spark's Kafka source writes for a new checkpoint: a zero byte, ``v1``, the JSON."""
    (ckpt / "sources" / "0").mkdir(parents=True)
    (ckpt / "sources" / "0" / "0").write_bytes(b"\0v1\n" + offsets.encode())


def _options(ckpt: Path, **more: str) -> SinkOptions:
    return SinkOptions.parse({"path": "out", "checkpointLocation": str(ckpt), **more})


def _part(partition: int, first: int) -> PartCommit:
    return PartCommit("t", partition, 1, 1, 0, 0, 1, first, first, {}, "", "")


def test_initial_offsets_read_sparks_file(tmp_path: Path) -> None:
    _initial(tmp_path, '{"t":{"0":100,"1":0}}')
    assert initial_offsets(str(tmp_path)) == {("t", 0): 100, ("t", 1): 0}
    assert initial_offsets(str(tmp_path / "none")) == {}


def test_a_start_above_zero_fails_naming_starting_offsets(tmp_path: Path) -> None:
    _initial(tmp_path, '{"t":{"0":100,"1":0}}')
    with pytest.raises(StartSkipsRecords) as failed:
        check_first_batch(_options(tmp_path), [])  # an empty first batch: the file says
    message = str(failed.value)
    assert "100 records" in message and "t[0] offsets 0..99" in message
    assert 'startingOffsets", "earliest"' in message and "t[1]" not in message
    assert len(message.splitlines()) == 1


def test_rows_of_the_batch_count_without_the_file(tmp_path: Path) -> None:
    with pytest.raises(StartSkipsRecords, match=r"t\[1\] offsets 0..6"):
        check_first_batch(_options(tmp_path), [_part(0, 0), _part(1, 7)])
    check_first_batch(_options(tmp_path), [_part(0, 0), _part(1, 0)])


@pytest.mark.parametrize("starting", ["earliest", "latest", '{"t":{"0":100}}'])
def test_a_stated_start_is_trusted(tmp_path: Path, starting: str) -> None:
    _initial(tmp_path, '{"t":{"0":100}}')
    check_first_batch(_options(tmp_path, startingOffsets=starting), [_part(0, 100)])


def test_skipping_a_single_record_fails_too(tmp_path: Path) -> None:
    _initial(tmp_path, '{"t":{"0":1}}')
    with pytest.raises(StartSkipsRecords, match=r"never read 1 records \(t\[0\] offsets 0..0"):
        check_first_batch(_options(tmp_path), [_part(0, 1)])


def test_a_start_at_zero_passes_when_the_first_row_comes_later(tmp_path: Path) -> None:
    """Spark's file says where the source started; the first row may be later (offsets 0..2
    were transaction markers, or compaction removed them): nothing was skipped."""
    _initial(tmp_path, '{"t":{"0":0}}')
    check_first_batch(_options(tmp_path), [_part(0, 3)])
