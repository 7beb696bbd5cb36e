"""What the checker refuses to read, and what it reads as another writer's: a proof needs a
ledger that holds entries of the right types, and the sink's own tables."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from pidfence.verify import LedgerEntry, VerifyInputError, check, verify_output
from pidfence.verify.ledger_input import read_ledgers
from tests.unit.test_verify_check import NO_REJECTS, log_table, only, rec, rejects_table, sent
from tests.unit.test_verify_cli import (  # noqa: F401 - output is a fixture
    PID,
    invoke,
    ledger_entries,
    output,
    write_ledger,
)


def test_an_empty_ledger_is_refused_not_passed(tmp_path: Path, output: Path) -> None:  # noqa: F811
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(VerifyInputError, match="holds no entry"):
        verify_output([empty], str(output))
    code, text = invoke("--ledger", str(empty), "--output", str(output))
    assert code == 2, text
    assert "pidfence verify: error:" in text and "holds no entry" in text


def test_a_ledger_of_fences_only_is_refused(tmp_path: Path, output: Path) -> None:  # noqa: F811
    """Its producers acknowledged no data record: every output passes against it (it passed,
    exit 0, beside an output of five rows)."""
    fences = [replace(e, fence=True) for e in ledger_entries()]
    ledger = write_ledger(tmp_path / "fences.jsonl", fences)
    code, text = invoke("--ledger", str(ledger), "--output", str(output))
    assert code == 2, text
    assert "FENCE entries only" in text


def test_a_ledger_of_torn_lines_only_is_refused(tmp_path: Path, output: Path) -> None:  # noqa: F811
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"pid": 11, "generation": 5, "top', encoding="utf-8")
    code, text = invoke("--ledger", str(torn), "--output", str(output))
    assert code == 2, text
    assert "1 torn line(s) only" in text


def test_torn_lines_are_counted_in_the_report(tmp_path: Path, output: Path) -> None:  # noqa: F811
    entries = ledger_entries()
    path = write_ledger(tmp_path / "l.jsonl", entries[:4])
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"pid": 11, "gene')  # killed mid-line; the resumed writer ends it
    write_ledger(path, entries[4:])
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"pid": 11, "generation": 6, "topic": "t"')  # killed again: last line
    code, text = invoke("--ledger", str(path), "--output", str(output), "--json")
    assert code == 0, text
    torn = json.loads(text)["findings"]["torn"]
    assert torn["count"] == 2
    assert [e["line"] for e in torn["examples"]] == [f"{path}:5", f"{path}:{len(entries) + 2}"]


@pytest.mark.parametrize(
    ("field", "bad"),
    [("fence", "false"), ("pid", "11"), ("seq", 1.5), ("pid", True), ("fence", 0)],
)
def test_a_field_of_the_wrong_type_names_file_and_line(
    tmp_path: Path,
    output: Path,  # noqa: F811
    field: str,
    bad: object,
) -> None:
    entries = ledger_entries()
    path = write_ledger(tmp_path / "l.jsonl", entries)
    lines = path.read_text(encoding="utf-8").splitlines()
    line = json.loads(lines[2])
    line[field] = bad
    lines[2] = json.dumps(line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    where = re.escape(f"{path}:3: not a ledger entry: field '{field}'")
    with pytest.raises(VerifyInputError, match=where):
        read_ledgers([path])
    code, text = invoke("--ledger", str(path), "--output", str(output))
    assert code == 2, text
    assert f"l.jsonl:3: not a ledger entry: field '{field}'" in text


def test_a_fence_entry_typed_false_as_a_string_cannot_hide_a_loss() -> None:
    # "fence": "false" is truthy: the old checker skipped the entry as a FENCE, the loss unseen.
    lost = dataclasses.replace(sent(0, 0), fence="false")  # type: ignore[arg-type]
    with pytest.raises(VerifyInputError, match=r"ledger entry 1 .*'fence'"):
        check([lost], log_table([]), NO_REJECTS)


def test_an_output_path_that_is_not_a_pidfence_table_exits_3(
    tmp_path: Path,
    output: Path,  # noqa: F811
) -> None:
    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries())
    # The folder above the table (--output out for out/log) read as an empty output before.
    code, text = invoke("--ledger", str(ledger), "--output", str(output.parent))
    assert code == 3, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert f"{output.parent} is not a pidfence output" in lines[0]
    # A --rejects that holds no table is refused the same way.
    (tmp_path / "nothing").mkdir()
    code, text = invoke(
        "--ledger", str(ledger), "--output", str(output), "--rejects", str(tmp_path / "nothing")
    )
    assert code == 3, text
    assert "is not a pidfence rejects table" in text


def test_a_rejects_row_without_a_pid_is_another_writers() -> None:
    ledger = [sent(0, 0)]
    rows = [rec(0, 0)]
    rejects = rejects_table([{**rec(1, 1), "verdict": "DUPLICATE"}])
    blank = pa.Table.from_pylist(
        [{"topic": "t", "partition": 0, "value": b"x", "offset": 5}], schema=rejects.schema
    )
    report = check(ledger, log_table(rows), pa.concat_tables([rejects, blank]))
    only(report, foreign=1)
    assert report.findings["foreign"].examples[0]["table"] == "rejects"


def test_a_log_row_without_an_identity_is_another_writers_even_without_written() -> None:
    log = log_table([rec(0, 0)])
    blank = pa.Table.from_pylist(
        [{"topic": "t", "partition": 0, "pid": 9, "value": b"x", "offset": 5}], schema=log.schema
    )
    report = check([sent(0, 0)], pa.concat_tables([log, blank]), NO_REJECTS)
    only(report, foreign=1)


def test_a_written_table_lacking_columns_is_named() -> None:
    log = log_table([rec(0, 0)])
    written = log.select(["topic", "partition", "pid"])
    with pytest.raises(VerifyInputError, match=r"written table lacks column\(s\) \['log_offset'"):
        check([sent(0, 0)], log, NO_REJECTS, written)


def test_check_still_takes_entries_built_in_python() -> None:
    entry = LedgerEntry(PID, 5, "t", 0, 0, "d", 0, 1_000, event="e")
    assert check([entry], log_table([]), NO_REJECTS).counts()["lost"] == 1
