"""A shared output: the checker judges the sink's rows, counts others' rows and deleted rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pidfence.verify import check
from pidfence.verify.provenance import KEY, split
from tests.unit.test_verify_check import NO_REJECTS, log_table, only, rec, sent


def written_of(log: pa.Table, batch: int = 0) -> pa.Table:
    """What the sink's own account says it appended: exactly these rows, in ``batch``."""
    keys = log.select(list(KEY))
    return keys.append_column("batch", pa.array([batch] * log.num_rows, pa.int64()))


def history(*operations: str, mode: str | None = None) -> list[dict[str, Any]]:
    """A log table's history (newest first, as deltalake lists it): the sink's creation,
    its batch 0 at version 1, then ``operations`` by another engine."""
    sink = {"pidfence.writer": "pidfence-sink"}
    commits: list[dict[str, Any]] = [
        {"version": 0, "operation": "CREATE TABLE", **sink},
        {"version": 1, "operation": "WRITE", "pidfence.batch": "0", **sink},
    ]
    for version, operation in enumerate(operations, start=2):
        params = {"mode": mode} if mode else {}
        commits.append({"version": version, "operation": operation, "operationParameters": params})
    return commits[::-1]


def test_rows_others_appended_are_counted_not_judged() -> None:
    rows = [rec(s, 10 + s) for s in range(4)]
    log = log_table(rows)
    written = written_of(log)
    # Another writer appends a copy of a sink row and a row claiming the producer's next seq,
    # and one with nulls in pidfence's columns (its own schema's nulls).
    copy = log.slice(1, 1)
    claim = log_table([rec(9, 99)]).slice(0, 1)
    blank = pa.Table.from_pylist(
        [{"topic": "t", "partition": 0, "value": b"mine"}], schema=log.schema
    )
    shared = pa.concat_tables([log, copy, claim, blank])
    ledger = [sent(s, 10 + s) for s in range(4)]
    # Without the sink's account the copy is a duplicate and the claim unacknowledged...
    assert check(ledger, shared.slice(0, 6), NO_REJECTS).counts()["duplicate"] == 1
    # ...with it, both are another writer's.
    report = check(ledger, shared, NO_REJECTS, written)
    only(report, foreign=3)
    assert report.ok


def test_rows_deleted_after_commit_are_neither_lost_nor_anomalies() -> None:
    rows = [rec(s, 10 + s) for s in range(5)]
    log = log_table(rows)
    written = written_of(log)
    kept = log.filter(pa.compute.not_equal(log["seq"], 2))
    ledger = [sent(s, 10 + s) for s in range(5)]
    assert not check(ledger, kept, NO_REJECTS).ok  # a plain checker calls it lost
    report = check(ledger, kept, NO_REJECTS, written, history=history("DELETE"))
    only(report, deleted=1)
    assert report.ok
    assert report.findings["deleted"].examples[0]["seq"] == 2
    assert report.findings["deleted"].examples[0]["removed_by"] == "version 2 (DELETE)"


def test_split_keeps_one_copy_of_each_written_row() -> None:
    log = log_table([rec(s, 10 + s) for s in range(3)])
    doubled = pa.concat_tables([log, log.slice(0, 2)])
    parts = split(doubled, written_of(log))
    assert parts.own.num_rows == 3 and parts.foreign.num_rows == 2
    assert parts.deleted.num_rows == 0


def test_every_copy_in_the_sinks_own_files_is_its_own() -> None:
    log = log_table([rec(s, 10 + s) for s in range(3)])
    # Row 1 twice in the sink's file, and once more in another writer's file.
    rows = pa.concat_tables([log, log.slice(1, 1), log.slice(1, 1)])
    parts = split(rows, written_of(log), [True, True, True, True, False])
    assert parts.own.num_rows == 4 and parts.foreign.num_rows == 1
    assert parts.deleted.num_rows == 0
    # The account's one copy of row 1 is used up by the sink's file, not by the other's copy.
    parts = split(rows, written_of(log), [True, False, True, True, False])
    assert parts.own.num_rows == 3 and parts.foreign.num_rows == 2


def test_file_flags_must_match_the_log() -> None:
    import pytest

    from pidfence.verify import VerifyInputError

    log = log_table([rec(0, 10)])
    with pytest.raises(VerifyInputError, match="1 log rows"):
        split(log, written_of(log), [True, False])


def test_a_value_another_writer_updated_after_commit_is_updated_not_lost() -> None:
    rows = [rec(s, 10 + s) for s in range(3)]
    log = log_table(rows)
    written = written_of(log)
    scrubbed = log_table([rows[0], {**rows[1], "value": b"scrubbed"}, rows[2]])
    ledger = [sent(s, 10 + s) for s in range(3)]
    report = check(ledger, scrubbed, NO_REJECTS, written, history=history("UPDATE"))
    only(report, updated=1)
    assert report.findings["updated"].examples[0]["changed_by"] == "version 2 (UPDATE)"
    # With no commit that rewrites rows after the sink's, a changed value is still wrong.
    report = check(ledger, scrubbed, NO_REJECTS, written, history=history())
    only(report, lost=1, unexpected=1, event_lost=1)


def test_scrubbing_many_rows_to_one_value_is_no_event_duplicate() -> None:
    rows = [rec(s, 10 + s) for s in range(4)]
    log = log_table(rows)
    scrubbed = log_table([{**r, "value": b""} for r in rows])
    ledger = [sent(s, 10 + s) for s in range(4)]
    report = check(ledger, scrubbed, NO_REJECTS, written_of(log), history=history("MERGE"))
    only(report, updated=4)
    # An updated row is still its event's copy: a second copy under another pid is caught.
    again = log_table([{**rows[0], "pid": rows[0]["pid"] + 1, "log_offset": 99}])
    report = check(
        ledger,
        pa.concat_tables([scrubbed, again]),
        NO_REJECTS,
        pa.concat_tables([written_of(log), written_of(again)]),
        history=history("MERGE"),
    )
    assert report.counts()["event_duplicate"] == 1
