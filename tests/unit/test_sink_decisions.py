"""A batch's decisions, and the rows a state rebuild replays from them, record by record."""

from __future__ import annotations

import pyarrow as pa

from pidfence.spark_sink.decisions import appended, decided_rows, replay_rows
from pidfence.wire import FLAG_FENCE, encode_pf
from tests.unit.test_delta_table import log_rows, reject_rows

#: Raw headers of two rejects: a FENCE record's (its flag is not in pid, generation, seq) and
#: a malformed one (no pid at all).
_FENCE_PF = encode_pf(7, 2, 5, FLAG_FENCE)
_GARBAGE_PF = b"\x07garbage"


def _rejects() -> pa.Table:
    rows = pa.concat_tables([reject_rows("t", 0, 5, 1, "FENCE"), reject_rows("t", 0, 6, 1, "X")])
    generation = rows.schema.get_field_index("generation")
    rows = rows.set_column(generation, "generation", pa.array([2, 0], pa.int64()))
    rows = rows.set_column(rows.schema.get_field_index("pid"), "pid", pa.array([7, 0], pa.int64()))
    verdicts = pa.array(["FENCE", "MALFORMED"], pa.string())
    rows = rows.set_column(rows.schema.get_field_index("verdict"), "verdict", verdicts)
    return rows.append_column("pf", pa.array([_FENCE_PF, _GARBAGE_PF], pa.binary()))


def test_a_replay_offers_each_decided_record_as_the_live_run_decided_it() -> None:
    log = log_rows("t", 0, 0, 3)
    decided = decided_rows(log, _rejects())
    assert appended(decided).column("log_offset").to_pylist() == [0, 1, 2]
    replay = replay_rows(decided)
    assert replay.column("offset").to_pylist() == [10, 12, 14, 20, 22]
    assert replay.column("pf").to_pylist() == [
        *(encode_pf(7, 1, seq) for seq in range(3)),  # appended: rebuilt from the identity
        _FENCE_PF,  # rejects: their raw header, flags and damage included
        _GARBAGE_PF,
    ]
    assert replay.column("verdict").to_pylist() == ["APPENDED"] * 3 + ["FENCE", "MALFORMED"]
    stamps_us = [1_700_000_000_000_000 + i for i in (0, 1, 2, 5, 6)]  # as log_rows makes them
    assert replay.column("ts_ms").to_pylist() == [t // 1000 for t in stamps_us]
    held = replay_rows(decided, "BUFFERED")
    assert held.column("verdict").to_pylist() == ["BUFFERED"] * 5
    assert held.column("pf").equals(replay.column("pf"))
