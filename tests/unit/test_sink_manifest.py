"""A batch manifest stored and read back is the same value, field by field."""

from __future__ import annotations

import json

import pytest

from pidfence.spark_sink.errors import ManifestUnreadable
from pidfence.spark_sink.gaps import GapReport
from pidfence.spark_sink.manifest import (
    BatchManifest,
    PartCommit,
    PartFiles,
    Position,
    Totals,
    decode_positions,
    encode_positions,
)


def _part(partition: int) -> PartCommit:
    """A part with every field set to a value of its own (none left at its default)."""
    return PartCommit(
        topic="t",
        partition=partition,
        rows_in=10,
        appended=6,
        rejected=3,
        log_start=20,
        log_end=26,
        kafka_first=100,
        kafka_last=109,
        counts={"APPENDED": 6, "DUPLICATE": 2, "FORGED": 1},
        state=f"00000000000000000004.e3-aa.{partition}.full",
        tag="e3-aabbccddeeff",
        files=PartFiles(
            log=f"data/q/4/t-{partition}.e3-aa.parquet",
            rejects=f"data/q/4/t-{partition}.e3-aa.rejects.parquet",
            held=f"_pidfence/_held/t~{partition}/4.e3-aa",
            decided=f"_pidfence/_decided/t~{partition}/4.e3-aa",
            stats={"log": '{"numRecords": 6}', "rejects": '{"numRecords": 3}'},
        ),
        held=1,
        flushed=True,
        forged={"unknown_key": 1},
        prev=2,
        gaps=(GapReport("lost", 7, 1, 50, 51, 104, 105),),
        horizon_ms=1_700_000_000_000,
        producers=3,
        state_bytes=4096,
        answers={"7": [7, "live", 3, 1_700_000_100_000]},
        rules={"reorder_window": 3},
    )


def test_a_manifest_read_back_is_the_one_stored() -> None:
    manifest = BatchManifest(
        batch=4,
        query="q",
        parts=(_part(0), _part(1)),
        totals=Totals(5, 50, 30, {"APPENDED": 30}, {"lost": 1}, 1_700_000_000_123),
        epoch=3,
    )
    back = BatchManifest.decode(manifest.encode())
    assert back == manifest
    assert back.epoch == 3  # which sink instance committed it: its run summary counts by it
    assert back.named() == manifest.named()
    assert len(back.named()) == 8


def test_positions_read_back_are_the_ones_stored() -> None:
    positions = {"t~0": Position(4, _part(0)), "t~1": Position(2, _part(1))}
    assert decode_positions(encode_positions(4, positions)) == positions


def test_a_whole_manifest_of_another_format_is_refused() -> None:
    body = json.loads(BatchManifest(batch=1, query="q", parts=(_part(0),)).encode())
    body["version"] = BatchManifest.VERSION + 1
    with pytest.raises(ManifestUnreadable, match=f"format {BatchManifest.VERSION + 1}"):
        BatchManifest.decode(json.dumps(body).encode())


@pytest.mark.parametrize("answer", [[7, ["live"], 3, 0], [7, "live"], "7,live,3,0"])
def test_a_manifest_with_a_damaged_answer_is_damaged(answer: object) -> None:
    """A damaged recorded answer surfaced only when a rebuild replayed the batch, as a raw
    TypeError/ValueError no exit code maps; it is a damaged manifest, by name, when read."""
    body = json.loads(BatchManifest(batch=1, query="q", parts=(_part(0),)).encode())
    body["parts"][0]["answers"] = {"7": answer}
    with pytest.raises(ManifestUnreadable, match="a damaged batch manifest"):
        BatchManifest.decode(json.dumps(body).encode())
