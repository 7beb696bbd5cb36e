"""The event-level checker (DESIGN §9) and the send ledger's fault handling."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidfence.ledger import (
    LedgerEntry,
    LedgerRefused,
    LedgerWriteFailed,
    LedgerWriter,
    read_ledger,
    value_digest,
)
from pidfence.verify import check
from tests.unit.test_verify_check import NO_REJECTS, log_table, only, rec, rejects_table, sent


def event(i: int) -> bytes:
    return b'{"uid": %d, "i": %d}' % (i % 3, i)


def test_zombie_resend_under_a_fresh_pid_is_an_event_duplicate() -> None:
    # Issue 10, scenario 1 as the old rollover produced it: B continues the checkpoint under
    # pid 7 and sends z10..z12; the zombie A rolls to a fresh pid 9 and re-sends them. Every
    # identity is clean; only the event view sees the duplicates.
    ledger = [sent(s, s, val=event(10 + s)) for s in range(3)]
    ledger += [sent(s, 10 + s, pid=9, gen=0, val=event(10 + s)) for s in range(3)]
    rows = [rec(s, s, val=event(10 + s)) for s in range(3)]
    rows += [rec(s, 10 + s, pid=9, gen=0, val=event(10 + s)) for s in range(3)]
    report = check(ledger, log_table(rows), NO_REJECTS)
    only(report, event_duplicate=3)
    assert not report.ok
    first = report.findings["event_duplicate"].examples[0]
    assert first["event"] == value_digest(event(10))
    assert len(first["copies"]) == 2


def test_explicit_event_ids_group_records_with_different_values() -> None:
    # The copier's id is the upstream position: two values (say a re-rendered timestamp) of one
    # upstream record are still one event.
    a = LedgerEntry(7, 3, "t", 0, 0, value_digest(b"a"), 0, 1_000, event="in:0:5")
    b = LedgerEntry(9, 0, "t", 0, 0, value_digest(b"b"), 1, 1_000, event="in:0:5")
    rows = [rec(0, 0, val=b"a"), rec(0, 1, pid=9, gen=0, val=b"b")]
    report = check([a, b], log_table(rows), NO_REJECTS)
    only(report, event_duplicate=1)
    assert report.findings["event_duplicate"].examples[0]["event"] == "in:0:5"


def test_event_lost_when_no_copy_is_appended_even_if_each_record_is_excused() -> None:
    # A FENCED reject excuses the record, not the event: the replacement never re-sent it.
    ledger = [sent(0, 0, gen=3)]
    rejects = rejects_table([{**rec(0, 0, gen=3), "verdict": "FENCED"}])
    report = check(ledger, log_table([]), rejects)
    only(report, event_lost=1)
    assert report.findings["event_lost"].examples[0]["sent_as"] == ["pid=7 g=3 t[0] seq=0"]


def test_event_sent_twice_and_appended_once_is_clean() -> None:
    ledger = [sent(0, 0, val=event(1)), sent(0, 1, pid=9, gen=0, val=event(1))]
    rejects = rejects_table([{**rec(0, 1, pid=9, gen=0, val=event(1)), "verdict": "FENCED"}])
    report = check(ledger, log_table([rec(0, 0, val=event(1))]), rejects)
    only(report)
    assert report.totals["events"] == 1


def test_unacknowledged_row_is_matched_to_its_event_by_digest() -> None:
    # The zombie's copy was appended but its ack was never recorded: still a duplicate event.
    ledger = [sent(0, 0, val=event(4)), sent(1, 1, val=event(5))]
    rows = [rec(0, 0, val=event(4)), rec(1, 1, val=event(5)), rec(0, 2, pid=9, gen=0, val=event(4))]
    report = check(ledger, log_table(rows), NO_REJECTS)
    assert report.findings["event_duplicate"].count == 1
    assert report.findings["unacknowledged"].count == 1  # pid 9 is in no ledger


@settings(max_examples=60, deadline=None)
@given(
    copies=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=12),
    pids=st.integers(min_value=1, max_value=3),
)
def test_event_counts_match_copies_in_the_log(copies: list[int], pids: int) -> None:
    """Property: event_lost = events with 0 copies; event_duplicate = sum of extra copies."""
    ledger: list[LedgerEntry] = []
    rows: list[dict[str, Any]] = []
    seqs: dict[int, int] = {}
    for i, n in enumerate(copies):
        for c in range(max(n, 1)):
            pid = 7 + (i + c) % pids
            seq = seqs.get(pid, 0)
            seqs[pid] = seq + 1
            ledger.append(sent(seq, len(ledger), pid=pid, val=event(i)))
            if c < n:
                rows.append(rec(seq, len(ledger), pid=pid, val=event(i)))
    rows.sort(key=lambda r: (r["pid"], r["seq"]))
    report = check(ledger, log_table(rows), rejects_table([]))
    assert report.findings["event_lost"].count == sum(1 for n in copies if n == 0)
    assert report.findings["event_duplicate"].count == sum(max(n - 1, 0) for n in copies)


def test_writer_ends_a_torn_line_and_reader_reports_it(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    with LedgerWriter(path) as writer:
        writer.write(sent(0, 0))
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"pid": 7, "generation": 3, "to')  # disk full mid-line
    with LedgerWriter(path) as writer:  # the resumed producer appends to the same file
        writer.write(sent(1, 1))
    torn: list[tuple[Path, int]] = []
    entries = list(read_ledger([path], on_torn=lambda p, n: torn.append((p, n))))
    assert entries == [sent(0, 0), sent(1, 1)]
    assert torn == [(path, 2)]


def test_complete_garbage_line_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    path.write_text('{"pid": 7} trailing}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"l\.jsonl:1: not a ledger entry"):
        list(read_ledger([path]))


class _FullDisk:
    closed = False

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self) -> None:
        self.closed = True


def test_full_disk_is_a_retriable_ledger_error(tmp_path: Path) -> None:
    writer = LedgerWriter(tmp_path / "l.jsonl")
    writer._file = _FullDisk()  # type: ignore[assignment]
    with pytest.raises(LedgerWriteFailed, match="free space") as info:
        writer.write(sent(0, 0))
    assert info.value.retriable
    with pytest.raises(LedgerWriteFailed):
        writer.close()
    assert writer._file.closed


def test_ledger_path_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LedgerRefused) as info:
        LedgerWriter(tmp_path)
    assert not info.value.retriable


def test_event_field_round_trips_and_old_lines_read_as_digest(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    old = {
        "pid": 7,
        "generation": 3,
        "topic": "t",
        "partition": 0,
        "seq": 0,
        "digest": "ab",
        "offset": 0,
        "ts_ms": 1,
        "fence": False,
        "expire_ms": 0,
    }
    path.write_text(json.dumps(old) + "\n", encoding="utf-8")
    with LedgerWriter(path) as writer:
        writer.write(LedgerEntry(7, 3, "t", 0, 1, "cd", 1, 1, event="in:0:1"))
    first, second = read_ledger([path])
    assert (first.event, first.event_id) == ("", "ab")
    assert second.event_id == "in:0:1"
