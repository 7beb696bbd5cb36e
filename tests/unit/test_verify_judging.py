"""False passes the checker must not give: a row the sink wrote twice, a row gone without a
delete, a dropped record excused by another send's equal bytes, a zombie copy among equal bytes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pidfence.ledger import LedgerEntry
from pidfence.spark_sink.delta import history as delta_history
from pidfence.spark_sink.delta import table as delta_table
from pidfence.verify import check, verify_output
from pidfence.verify.removals import Removals, removes_rows
from tests.unit.test_verify_check import (
    NO_REJECTS,
    PID,
    log_table,
    only,
    rec,
    rejects_table,
    sent,
    value,
)
from tests.unit.test_verify_cli import (  # noqa: F401
    ledger_entries,
    output,
    write_ledger,
    write_output,
)
from tests.unit.test_verify_provenance import history, written_of


def test_a_row_the_sinks_own_account_lists_twice_is_a_duplicate() -> None:
    rows = [rec(s, 10 + s) for s in range(3)]
    log = log_table(rows)
    twice = pa.concat_tables([log, log.slice(1, 1)])  # batch committed twice: two copies
    written = pa.concat_tables([written_of(log), written_of(log.slice(1, 1), batch=1)])
    ledger = [sent(s, 10 + s) for s in range(3)]
    report = check(ledger, twice, NO_REJECTS, written)
    # Before: the second copy was called another writer's (foreign) and the run passed.
    only(report, duplicate=1, event_duplicate=1)
    assert report.findings["duplicate"].examples[0]["seq"] == 1


def test_a_copy_the_account_lists_once_is_still_another_writers() -> None:
    log = log_table([rec(s, 10 + s) for s in range(3)])
    report = check(
        [sent(s, 10 + s) for s in range(3)],
        pa.concat_tables([log, log.slice(1, 1)]),
        NO_REJECTS,
        written_of(log),
    )
    only(report, foreign=1)


@pytest.mark.parametrize(
    ("operations", "mode"),
    [
        ((), None),  # a data file lost, nobody deleted anything
        (("OPTIMIZE", "VACUUM START", "VACUUM END"), None),  # table care removes no rows
        (("FSCK REPAIR TABLE",), None),  # drops entries of files that are gone: a loss
        (("WRITE",), "Append"),  # another writer's append
    ],
)
def test_a_row_gone_without_a_removing_commit_is_lost(
    operations: tuple[str, ...], mode: str | None
) -> None:
    log = log_table([rec(s, 10 + s) for s in range(3)])
    written = written_of(log)
    kept = log.filter(pc.not_equal(log["seq"], 1))
    report = check(
        [sent(s, 10 + s) for s in range(3)],
        kept,
        NO_REJECTS,
        written,
        history=history(*operations, mode=mode),
    )
    # Before: counted as deleted and the run passed whatever removed it.
    only(report, lost=1, event_lost=1)
    assert "no commit after it that removes rows" in report.findings["lost"].examples[0]["why"]


@pytest.mark.parametrize(
    ("operation", "mode"),
    [
        ("DELETE", None),
        ("MERGE", None),
        ("UPDATE", None),
        ("RESTORE", None),
        ("WRITE", "Overwrite"),
        ("CREATE OR REPLACE TABLE", None),
        ("STREAMING UPDATE", "Complete"),
    ],
)
def test_a_row_gone_after_a_removing_commit_is_deleted(operation: str, mode: str | None) -> None:
    log = log_table([rec(s, 10 + s) for s in range(3)])
    kept = log.filter(pc.not_equal(log["seq"], 1))
    report = check(
        [sent(s, 10 + s) for s in range(3)],
        kept,
        NO_REJECTS,
        written_of(log),
        history=history(operation, mode=mode),
    )
    only(report, deleted=1)


def test_a_delete_before_the_batch_was_committed_does_not_excuse_it() -> None:
    commits = [
        {"version": 0, "operation": "CREATE TABLE", "pidfence.writer": "pidfence-sink"},
        {"version": 1, "operation": "DELETE"},
        {"version": 2, "operation": "WRITE", "pidfence.writer": "s", "pidfence.batch": "0"},
    ]
    assert Removals(commits).after(0) is None
    assert Removals(commits).after(7) is None  # a batch a whole history never committed
    assert Removals(commits[1:]).after(7) == (1, "DELETE")  # older than the retained history
    assert not removes_rows({"operation": "DELETE", "pidfence.writer": "pidfence-sink"})


@pytest.mark.parametrize(
    ("operation", "params", "removes"),
    [
        ("WRITE", {"mode": '"Overwrite"'}, True),
        ("WRITE", {"mode": '"Append"'}, False),
        ("WRITE", {"replaceWhere": "day = 3"}, True),
        ("WRITE", {"replaceWhere": ""}, False),
        ("STREAMING UPDATE", {"outputMode": '"Complete"'}, True),
        ("STREAMING UPDATE", {"outputMode": "Append"}, False),
        ("write", {"mode": "overwrite"}, True),
        ("OPTIMIZE", {"mode": "Overwrite"}, False),
    ],
)
def test_removing_writes_are_read_from_their_parameters_as_engines_record_them(
    operation: str, params: dict[str, str], removes: bool
) -> None:
    """Engines record a write's parameters JSON-quoted (``"Overwrite"``) or bare, and a
    ``replaceWhere`` overwrite may carry no ``mode``: each is read as the removal it is."""
    commit = {"version": 3, "operation": operation, "operationParameters": params}
    assert removes_rows(commit) is removes


def test_the_removal_rules_read_the_sinks_own_commit_keys() -> None:
    from pidfence.verify import removals

    assert removals._WRITER_KEY == delta_table.WRITER_KEY
    assert removals._BATCH_KEY == delta_history.BATCH_KEY


def test_verify_output_tells_a_delete_from_a_lost_data_file(
    tmp_path: Path,
    output: Path,  # noqa: F811
) -> None:
    from deltalake import DeltaTable

    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries())
    assert verify_output([ledger], str(output)).ok
    # A data file of batch 1 removed from the table's files behind Delta's back: lost.
    table = DeltaTable(str(output))
    files = sorted(table.file_uris())
    assert len(files) == 2
    Path(files[-1].removeprefix("file://")).unlink()
    table.repair(dry_run=False)  # FSCK: the table now reads without the file
    report = verify_output([ledger], str(output))
    assert report.counts()["lost"] > 0 and report.counts()["deleted"] == 0
    assert not report.ok


def test_verify_output_excuses_a_users_delete(tmp_path: Path, output: Path) -> None:  # noqa: F811
    from deltalake import DeltaTable

    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries())
    DeltaTable(str(output)).delete("seq = 1")
    report = verify_output([ledger], str(output))
    assert report.ok, report.to_dict()
    assert report.counts()["deleted"] == 1


def assert_an_extra_copy_in_a_sink_file_is_a_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A sink whose writer puts one row twice into its own data file of the output at ``path``
    (its account lists it once): ``verify`` finds the duplicate."""
    from pidfence.spark_sink import output as output_mod

    real = output_mod.table_rows

    def doubling(rows: pa.Table, kind: str) -> pa.Table:
        staged = real(rows, kind)  # type: ignore[arg-type]
        return pa.concat_tables([staged, staged.slice(0, 1)]) if kind == "log" else staged

    monkeypatch.setattr(output_mod, "table_rows", doubling)
    write_output(path, monkeypatch)
    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries())
    report = verify_output([ledger], path)
    # Before: each copy was passed as another writer's (foreign) and the run passed.
    assert report.counts()["duplicate"] == 2, report.to_dict()
    assert report.counts()["foreign"] == 0
    assert not report.ok


def test_an_extra_copy_inside_a_sink_data_file_is_a_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_an_extra_copy_in_a_sink_file_is_a_duplicate(tmp_path, monkeypatch, str(tmp_path / "o"))


def test_rows_compaction_moved_out_of_the_sinks_files_stay_the_sinks(
    tmp_path: Path,
    output: Path,  # noqa: F811
) -> None:
    from deltalake import DeltaTable, write_deltalake

    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries())
    DeltaTable(str(output)).optimize.compact()
    copy = DeltaTable(str(output)).to_pyarrow_table().slice(0, 1)
    write_deltalake(str(output), copy, mode="append")  # another writer's copy of a sink row
    report = verify_output([ledger], str(output))
    assert report.ok, report.to_dict()
    assert report.counts()["foreign"] == 1


def test_verify_output_excuses_a_users_update(tmp_path: Path, output: Path) -> None:  # noqa: F811
    from deltalake import DeltaTable

    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries())
    DeltaTable(str(output)).update(
        predicate="seq = 1", updates={"value": "arrow_cast('scrubbed', 'Binary')"}
    )
    report = verify_output([ledger], str(output))
    # Before: the scrubbed row was unexpected and its record lost (exit 1).
    assert report.ok, report.to_dict()
    assert report.counts()["updated"] == 1


def test_equal_bytes_of_another_send_do_not_excuse_a_dropped_record() -> None:
    # Two distinct sends with identical bytes (default event ids), the second dropped.
    same = b"tick"
    ledger = [sent(0, 0, val=same), sent(1, 1, val=same)]
    rejects = rejects_table([{**rec(1, 1, val=same), "verdict": "OUT_OF_ORDER"}])
    report = check(ledger, log_table([rec(0, 0, val=same)]), rejects)
    # Before: superseded (the first send's row has the same digest) and the run passed.
    only(report, lost=1)
    assert not report.ok


def test_a_resend_whose_ack_was_not_recorded_still_supersedes_with_default_ids() -> None:
    # The successor's copy is in no ledger line: it can only be the dropped record's event.
    ledger = [sent(0, 0)]
    rejects = rejects_table([{**rec(0, 0), "verdict": "OUT_OF_ORDER"}])
    rows = [rec(0, 1, pid=PID + 1, val=value(0))]
    report = check(ledger, log_table(rows), rejects)
    only(report, superseded=1, unacknowledged=1)


def test_explicit_ids_of_other_events_do_not_excuse_a_dropped_record() -> None:
    same = b"tick"
    rejects = rejects_table([{**rec(1, 1, val=same), "verdict": "OUT_OF_ORDER"}])
    report = check(_two_events_of_equal_bytes(same), log_table([rec(0, 0, val=same)]), rejects)
    only(report, lost=1, event_lost=1)


def _two_events_of_equal_bytes(same: bytes) -> list[LedgerEntry]:
    """Two sends of the same bytes, each its own event (explicit ids)."""
    return [
        dataclasses.replace(sent(0, 0, val=same), event="in:0:1"),
        dataclasses.replace(sent(1, 1, val=same), event="in:0:2"),
    ]


def test_a_zombie_copy_under_an_unledgered_pid_among_equal_bytes_is_a_duplicate() -> None:
    same = b"tick"
    rows = [rec(0, 0, val=same), rec(1, 1, val=same), rec(0, 2, pid=99, gen=0, val=same)]
    report = check(_two_events_of_equal_bytes(same), log_table(rows), NO_REJECTS)
    # Before: two events share the digest, so the unledgered copy was its own "event".
    only(report, event_duplicate=1, unacknowledged=1)


def test_an_unledgered_copy_fills_an_event_with_no_other_copy() -> None:
    # b's only copy was appended under a pid whose acknowledgement no ledger recorded.
    same = b"tick"
    rejects = rejects_table([{**rec(1, 1, val=same), "verdict": "FENCED"}])
    rows = [rec(0, 2, pid=99, gen=0, val=same), rec(0, 0, val=same)]
    report = check(_two_events_of_equal_bytes(same), log_table(rows), rejects)
    only(report, unacknowledged=1)


def test_a_row_of_an_explicit_event_does_not_excuse_a_default_id_record_of_equal_bytes() -> None:
    same = b"tick"
    named = dataclasses.replace(sent(0, 0, val=same), event="in:0:1")
    dropped = sent(1, 1, val=same)  # default id: the digest
    rejects = rejects_table([{**rec(1, 1, val=same), "verdict": "OUT_OF_ORDER"}])
    report = check([named, dropped], log_table([rec(0, 0, val=same)]), rejects)
    only(report, lost=1, event_lost=1)
