"""The checker (DESIGN §8): each anomaly built by hand is caught, exactly, and nothing else."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypedDict, Unpack

import pyarrow as pa
import pytest
from rich.console import Console

from pidfence.ledger import LedgerWriter, ledger_files, read_ledger, value_digest
from pidfence.spark_sink.schema import LOG_SCHEMA as SINK_LOG_SCHEMA
from pidfence.verify import ANOMALIES, INFORMATIONAL, LOG_COLUMNS, CheckReport, LedgerEntry, check
from pidfence.verify.errors import VerifyInputError
from pidfence.verify.finding import MAX_EXAMPLES

TOPIC = "t"
PID = 7
GEN = 3

#: The sink's log (its types), with the columns the checker reads, in the checker's order.
LOG_SCHEMA = pa.schema([SINK_LOG_SCHEMA.field(name) for name in LOG_COLUMNS])
REJECTS_SCHEMA = LOG_SCHEMA.append(pa.field("verdict", pa.string()))


def value(seq: int, pid: int = PID, partition: int = 0) -> bytes:
    """The value every test sends for (pid, partition, seq), so digests line up."""
    return b"v-%d-%d-%d" % (pid, partition, seq)


def rec(
    seq: int,
    offset: int,
    *,
    pid: int = PID,
    gen: int = GEN,
    partition: int = 0,
    val: bytes | None = None,
    verdict: str | None = None,
) -> dict[str, Any]:
    """One Kafka record as the sink sees it (``verdict`` only for rejects)."""
    row: dict[str, Any] = {
        "topic": TOPIC,
        "partition": partition,
        "pid": pid,
        "generation": gen,
        "seq": seq,
        "key": b"k",
        "value": value(seq, pid, partition) if val is None else val,
        "offset": offset,
        "timestamp": 1_000 + offset,
    }
    if verdict is not None:
        row["verdict"] = verdict
    return row


def log_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The output log: ``rows`` in append order; ``log_offset`` counted per partition."""
    next_offset: dict[int, int] = {}
    out = []
    for row in rows:
        n = next_offset.get(row["partition"], 0)
        next_offset[row["partition"]] = n + 1
        out.append({**row, "log_offset": n})
    return pa.Table.from_pylist(out, schema=LOG_SCHEMA)


def rejects_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The rejects log (every row carries ``verdict``)."""
    return pa.Table.from_pylist([{**row, "log_offset": 0} for row in rows], schema=REJECTS_SCHEMA)


class Sent(TypedDict, total=False):
    """Which record :func:`sent` acknowledges: :func:`rec`'s keywords but ``verdict``."""

    pid: int
    gen: int
    partition: int
    val: bytes | None


def sent(
    seq: int,
    offset: int,
    *,
    fence: bool = False,
    ts_ms: int | None = None,
    expire_ms: int = 0,
    **record: Unpack[Sent],
) -> LedgerEntry:
    """A ledger entry: Kafka acknowledged ``rec(seq, offset, **record)`` (empty if a FENCE)."""
    row = rec(seq, offset, **({**record, "val": b""} if fence else record))
    return LedgerEntry(
        pid=row["pid"],
        generation=row["generation"],
        topic=row["topic"],
        partition=row["partition"],
        seq=seq,
        digest=value_digest(row["value"]),
        offset=offset,
        ts_ms=row["timestamp"] if ts_ms is None else ts_ms,
        fence=fence,
        expire_ms=expire_ms,
    )


def clean_history(n: int = 5) -> tuple[list[LedgerEntry], list[dict[str, Any]]]:
    """``n`` records of one producer, all acknowledged and appended in order."""
    return [sent(s, s) for s in range(n)], [rec(s, s) for s in range(n)]


def only(report: CheckReport, **expected: int) -> None:
    """Every count is 0 except the ones named."""
    counts = report.counts()
    assert set(counts) == {*ANOMALIES, *INFORMATIONAL}
    assert counts == {name: expected.get(name, 0) for name in counts}, report.to_dict()


NO_REJECTS = rejects_table([])


def test_clean_history_passes() -> None:
    ledger, rows = clean_history()
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report)
    assert report.ok
    assert report.summary() == "ok"
    assert report.totals == {"ledger": 5, "log": 5, "rejects": 0, "events": 5}


def test_empty_inputs_pass() -> None:
    report = check([], log_table([]), NO_REJECTS)
    assert report.ok
    assert report.totals == {"ledger": 0, "log": 0, "rejects": 0, "events": 0}


def test_lost_record_missing_from_log_and_rejects() -> None:
    ledger, rows = clean_history()
    del rows[2]
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report, lost=1, event_lost=1)
    assert not report.ok
    (example,) = report.findings["lost"].examples
    assert (example["pid"], example["seq"], example["offset"]) == (PID, 2, 2)
    assert example["verdicts"] == []
    assert report.summary() == "lost=1, event_lost=1"


def test_lost_record_rejected_for_a_reason_that_is_no_excuse() -> None:
    ledger, rows = clean_history()
    dropped = rows.pop(3)
    rejects = rejects_table([{**dropped, "verdict": "INVALID_GENERATION"}])
    report = check(ledger, log_table(rows), rejects)
    only(report, lost=1, event_lost=1)
    assert report.findings["lost"].examples[0]["verdicts"] == ["INVALID_GENERATION"]


def test_duplicate_counts_every_extra_copy_and_keeps_one_example() -> None:
    ledger, rows = clean_history()
    rows += [rec(1, 10), rec(1, 11), rec(4, 12)]  # seq 1 three times, seq 4 twice
    report = check(ledger, log_table(rows), NO_REJECTS)
    counts = report.counts()
    assert counts["duplicate"] == 3
    examples = report.findings["duplicate"].examples
    assert [(e["seq"], e["offset"]) for e in examples] == [(1, 10), (4, 12)]
    # A copy appended after a higher seq is also out of order: both rules see it.
    assert counts["reordered"] == 2
    assert counts["lost"] == counts["unexpected"] == counts["zombie"] == 0


def test_duplicate_in_log_order_only_is_not_reordered() -> None:
    ledger, rows = clean_history()
    rows.insert(2, rec(1, 20))  # 0 1 1 2 3 4
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report, duplicate=1, event_duplicate=1)
    assert report.findings["duplicate"].examples[0]["log_offset"] == 2


def test_reordered_seq_within_pid_and_partition() -> None:
    ledger, rows = clean_history()
    rows[1], rows[2] = rows[2], rows[1]  # log order 0 2 1 3 4
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report, reordered=1)
    (example,) = report.findings["reordered"].examples
    assert (example["seq"], example["after_seq"], example["log_offset"]) == (1, 2, 2)


def test_a_hole_filled_late_is_not_reordered() -> None:
    """Seqs 2 and 3 timed out and were skipped (a ``lost`` gap); the resume's re-sends fill the
    open hole after 4 and 5 were appended (``filled``): no reordering. A late record the sink
    did not report as filling a hole still is."""
    ledger = [sent(s, s) for s in range(6)]
    rows = [rec(s, s) for s in (0, 1, 4, 5)] + [rec(2, 2), rec(3, 3)]
    gaps = pa.Table.from_pylist(
        [
            {"topic": TOPIC, "partition": 0, "kind": kind, "pid": PID, "generation": GEN}
            | {"seq_first": first, "seq_last": last}
            for kind, first, last in (("lost", 2, 3), ("filled", 2, 2), ("filled", 3, 3))
        ]
    )
    report = check(ledger, log_table(rows), NO_REJECTS, gaps=gaps)
    only(report, upstream_gap=3)
    report = check(ledger, log_table(rows), NO_REJECTS, gaps=gaps.slice(0, 2))
    only(report, upstream_gap=2, reordered=1)
    assert report.findings["reordered"].examples[0]["seq"] == 3


def test_interleaving_partitions_and_pids_is_not_reordered() -> None:
    ledger = [sent(s, s, pid=p, partition=q) for p in (1, 2) for q in (0, 1) for s in range(3)]
    rows = [rec(s, s, pid=p, partition=q) for s in range(3) for q in (1, 0) for p in (2, 1)]
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report)


def test_zombie_appended_after_a_fence_reached_the_partition() -> None:
    ledger = [sent(0, 0), sent(1, 1), sent(2, 2, gen=GEN + 1, fence=True), sent(2, 3)]
    rows = [rec(0, 0), rec(1, 1), rec(2, 3)]
    fence = {**rec(2, 2, gen=GEN + 1, val=b""), "verdict": "FENCE"}
    report = check(ledger, log_table(rows), rejects_table([fence]))
    only(report, zombie=1)
    (example,) = report.findings["zombie"].examples
    assert (example["generation"], example["seq"], example["fenced_by_generation"]) == (
        GEN,
        2,
        GEN + 1,
    )


def test_zombie_appended_after_a_newer_generation_appended() -> None:
    ledger = [sent(0, 0), sent(1, 1, gen=GEN + 1), sent(2, 2)]
    rows = [rec(0, 0), rec(1, 1, gen=GEN + 1), rec(2, 2)]
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report, zombie=1)
    assert report.findings["zombie"].examples[0]["offset"] == 2


def test_old_generation_before_the_fence_is_no_zombie() -> None:
    # Kafka order decides, not log order: a record held for reordering is appended later, but it
    # reached the partition before the fence.
    ledger = [sent(1, 0), sent(0, 1), sent(2, 2, gen=GEN + 1, fence=True), sent(2, 3, gen=GEN + 1)]
    rows = [rec(0, 1), rec(1, 0), rec(2, 3, gen=GEN + 1)]
    fence = {**rec(2, 2, gen=GEN + 1, val=b""), "verdict": "FENCE"}
    report = check(ledger, log_table(rows), rejects_table([fence]))
    only(report)


def test_fence_on_another_partition_does_not_make_a_zombie() -> None:
    ledger = [sent(0, 0, partition=1), sent(0, 1)]
    rows = [rec(0, 0, partition=1), rec(0, 1)]
    fence = {**rec(1, 0, gen=GEN + 1, val=b"", partition=1), "verdict": "FENCE"}
    report = check(ledger, log_table(rows), rejects_table([fence]))
    only(report)


def test_pid_in_no_ledger_is_unacknowledged() -> None:
    # A successor pid whose process died before its first ack was recorded: its record landed,
    # and the resumer (recovery scan) did not re-send it. Informational, not a failure.
    ledger, rows = clean_history()
    rows.append(rec(0, 9, pid=99))
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report, unacknowledged=1)
    (example,) = report.findings["unacknowledged"].examples
    assert (example["pid"], example["why"]) == (99, "pid in no ledger")


def test_record_below_the_acknowledged_top_without_an_ack_is_unacknowledged() -> None:
    # A process killed before its ack was recorded; its resumer found the record in Kafka
    # (recovery scan) and did not re-send it, so later seqs are acknowledged and this one is not.
    ledger, rows = clean_history()
    del ledger[2]
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report, unacknowledged=1)
    (example,) = report.findings["unacknowledged"].examples
    assert (example["seq"], example["below_acknowledged"]) == (2, True)


def test_dropped_record_whose_event_a_resume_appended_elsewhere_is_superseded() -> None:
    ledger, rows = clean_history(3)
    # Acknowledged, dropped OUT_OF_ORDER behind a gap nobody filled; the resumer's successor
    # re-sent its event (the producer's event id names it: the same event under a new pid).
    late = dataclasses.replace(sent(3, 3), event="orders:3")
    rejects = rejects_table([{**rec(3, 3), "verdict": "OUT_OF_ORDER"}])
    again = dataclasses.replace(sent(0, 4, pid=PID + 1, val=value(3)), event="orders:3")
    rows.append(rec(0, 4, pid=PID + 1, val=value(3)))
    report = check([*ledger, late, again], log_table(rows), rejects)
    only(report, superseded=1)
    assert report.ok
    # Without the re-send, it is lost (per record and per event).
    report = check([*ledger, late], log_table(rows[:3]), rejects)
    only(report, lost=1, event_lost=1)


def test_unexpected_value_differs_from_the_acknowledged_one() -> None:
    ledger, rows = clean_history()
    rows[4] = rec(4, 4, val=b"forged")
    report = check(ledger, log_table(rows), NO_REJECTS)
    # The acknowledged value is not in the log either.
    only(report, unexpected=1, lost=1, event_lost=1)
    assert report.findings["unexpected"].examples[0]["why"] == "digest differs from ledger"
    assert report.findings["lost"].examples[0]["seq"] == 4


def test_fenced_reject_of_an_acknowledged_record_is_excused() -> None:
    # The zombie's seq 2 (acknowledged by Kafka) is FENCED; its replacement sends seq 2 again.
    ledger = [
        sent(0, 0),
        sent(1, 1),
        sent(2, 2, gen=GEN + 1, fence=True),
        sent(2, 3),
        sent(2, 4, gen=GEN + 1),
    ]
    rows = [rec(0, 0), rec(1, 1), rec(2, 4, gen=GEN + 1)]
    rejects = [
        {**rec(2, 2, gen=GEN + 1, val=b""), "verdict": "FENCE"},
        {**rec(2, 3), "verdict": "FENCED"},
    ]
    report = check(ledger, log_table(rows), rejects_table(rejects))
    only(report)


def test_fenced_zombie_write_does_not_excuse_the_replacements_loss() -> None:
    # Same seq under two generations: the zombie's copy is FENCED (excused), the replacement's is
    # dropped as INVALID_GENERATION and appears nowhere: that one is lost.
    ledger = [sent(0, 0), sent(1, 1), sent(1, 2, gen=GEN + 2)]
    rows = [rec(0, 0)]
    rejects = [
        {**rec(1, 1), "verdict": "FENCED"},
        {**rec(1, 2, gen=GEN + 2), "verdict": "INVALID_GENERATION"},
    ]
    report = check(ledger, log_table(rows), rejects_table(rejects))
    only(report, lost=1, event_lost=1)
    (example,) = report.findings["lost"].examples
    assert (example["generation"], example["verdicts"]) == (GEN + 2, ["INVALID_GENERATION"])


def test_duplicate_reject_whose_original_is_in_the_log_is_excused() -> None:
    ledger, rows = clean_history()
    ledger.append(sent(3, 9))  # a transport resend, acknowledged again
    rejects = [{**rec(3, 9), "verdict": "DUPLICATE"}]
    report = check(ledger, log_table(rows), rejects_table(rejects))
    only(report)


def test_duplicate_reject_whose_original_is_missing_is_lost() -> None:
    ledger, rows = clean_history()
    del rows[3]
    rejects = [{**rec(3, 9), "verdict": "DUPLICATE"}]
    report = check([*ledger, sent(3, 9)], log_table(rows), rejects_table(rejects))
    only(report, lost=1, event_lost=1)
    assert report.findings["lost"].examples[0]["verdicts"] == ["DUPLICATE"]


def test_non_idempotent_records_are_not_judged() -> None:
    ledger, rows = clean_history()
    plain = [rec(0, 20 + i, pid=0, gen=0, val=b"plain") for i in range(3)]
    report = check(ledger, log_table([*rows, *plain]), NO_REJECTS)
    only(report)
    assert report.totals["log"] == 8


def test_fence_entries_in_the_ledger_are_not_records() -> None:
    ledger, rows = clean_history()
    ledger.append(sent(5, 5, gen=GEN + 1, fence=True))
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report)


def test_unacknowledged_tail_is_informational() -> None:
    # Killed after Kafka wrote seq 5 but before the ledger recorded its acknowledgement.
    ledger, rows = clean_history()
    rows.append(rec(5, 5))
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report, unacknowledged=1)
    assert report.ok


def test_expired_lease_write_is_informational() -> None:
    ledger, rows = clean_history()
    late = sent(5, 5, ts_ms=5_000, expire_ms=4_000)
    rejects = [{**rec(5, 5), "verdict": "UNKNOWN_PID"}]
    report = check([*ledger, late], log_table(rows), rejects_table(rejects))
    only(report, expired=1, event_lost=1)
    # The record-level count is informational, but the event never reached the log: unless
    # another copy of it was appended, the event is lost (DESIGN §9).
    assert not report.ok
    resent = sent(0, 6, pid=PID + 1, val=value(5))
    appended = rec(0, 6, pid=PID + 1, val=value(5))
    report = check([*ledger, late, resent], log_table([*rows, appended]), rejects_table(rejects))
    only(report, expired=1)
    assert report.ok
    # A lease ends at its expire_ms (as the lease servers, certificates and producers count):
    # a write at that very millisecond is a late one too.
    at_end = sent(5, 5, ts_ms=4_000, expire_ms=4_000)
    only(check([*ledger, at_end], log_table(rows), rejects_table(rejects)), expired=1, event_lost=1)
    # The same rejection of a record sent inside its lease is a loss.
    inside = sent(5, 5, ts_ms=3_999, expire_ms=4_000)
    report = check([*ledger, inside], log_table(rows), rejects_table(rejects))
    only(report, lost=1, event_lost=1)


def test_examples_are_capped_but_counts_are_not() -> None:
    ledger, _ = clean_history(25)
    report = check(ledger, log_table([]), NO_REJECTS)
    assert report.findings["lost"].count == 25
    assert len(report.findings["lost"].examples) == MAX_EXAMPLES


@pytest.mark.parametrize("column", ["seq", "value", "offset"])
def test_missing_column_is_named(column: str) -> None:
    ledger, rows = clean_history()
    with pytest.raises(VerifyInputError, match=column):
        check(ledger, log_table(rows).drop_columns([column]), NO_REJECTS)


def test_missing_verdict_column_in_rejects_is_named() -> None:
    with pytest.raises(VerifyInputError, match="verdict"):
        check([], log_table([]), log_table([]))


def test_report_to_dict_is_json_and_render_lists_every_count() -> None:
    ledger, rows = clean_history()
    del rows[0]
    report = check(ledger, log_table(rows), NO_REJECTS)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False
    assert data["findings"]["lost"]["count"] == 1
    assert data["findings"]["lost"]["examples"][0]["seq"] == 0
    console = Console(width=200, record=True)
    console.print(report.render())
    text = console.export_text()
    for name in (*ANOMALIES, *INFORMATIONAL):
        assert name in text
    assert "seq=0" in text
    assert "verdicts=[]" in text  # printed as text, not parsed as rich markup


# --- the send ledger -------------------------------------------------------------------------


def test_ledger_round_trip_files_and_folders(tmp_path: Path) -> None:
    entries = [sent(s, s) for s in range(3)]
    with LedgerWriter(tmp_path / "a.jsonl") as writer:
        for entry in entries[:2]:
            writer.write(entry)
    with LedgerWriter(tmp_path / "b.jsonl") as writer:
        writer.write(entries[2])
    (tmp_path / "notes.txt").write_text("not a ledger\n")
    assert list(read_ledger([tmp_path])) == entries
    assert list(read_ledger([tmp_path / "b.jsonl", tmp_path / "a.jsonl"])) == [
        entries[2],
        *entries[:2],
    ]
    assert ledger_files([tmp_path]) == [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]


def test_ledger_skips_a_torn_last_line_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    with LedgerWriter(path) as writer:
        writer.write(sent(0, 0))
    with path.open("a", encoding="utf-8") as handle:
        handle.write('\n{"pid": 7, "generation"')  # SIGKILL mid-write
    assert list(read_ledger([path])) == [sent(0, 0)]


@pytest.mark.parametrize("line", ['{"pid": 1}', "[1, 2]", "{not json"])
def test_ledger_bad_line_names_file_and_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "l.jsonl"
    with LedgerWriter(path) as writer:
        writer.write(sent(0, 0))
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    with pytest.raises(ValueError, match=r"l\.jsonl:2: not a ledger entry"):
        list(read_ledger([path]))


def test_ledger_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        list(read_ledger([tmp_path / "nope.jsonl"]))
