"""``pidfence verify`` on a real output directory written by the sink's writer (no Spark)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.writer import PidfenceStreamWriter
from pidfence.verify import LedgerEntry, LedgerWriter, value_digest
from pidfence.wire import FLAG_FENCE, encode_pf

TOPIC = "t"
PID = 11
GEN = 5
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
# (header, value): seq 0..3, a transport resend of 2, a FENCE of GEN+1, a zombie's seq 4 (FENCED),
# the replacement's seq 4, and one record without a header.
Sent = tuple[bytes | None, bytes]
RECORDS: list[Sent] = [
    *[(encode_pf(PID, GEN, s), b"v%d" % s) for s in range(4)],
    (encode_pf(PID, GEN, 2), b"v2"),
    (encode_pf(PID, GEN + 1, 4, FLAG_FENCE), b""),
    (encode_pf(PID, GEN, 4), b"v4"),
    (encode_pf(PID, GEN + 1, 4), b"v4"),
    (None, b"plain"),
]


def kafka_rows(records: list[Sent], first_offset: int) -> pa.Table:
    """Rows shaped like Spark's Kafka source, one partition."""
    n = len(records)
    return pa.table(
        {
            "key": pa.array([b"k"] * n, pa.binary()),
            "value": pa.array([v for _, v in records], pa.binary()),
            "topic": pa.array([TOPIC] * n, pa.string()),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "timestamp": pa.array([1_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "headers": pa.array(
                [[{"key": "pf", "value": h}] if h is not None else [] for h, _ in records],
                HEADERS_TYPE,
            ),
        }
    )


@pytest.fixture
def output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An output directory with two committed batches of ``RECORDS``."""
    return build_output(tmp_path, monkeypatch)


def build_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Write two batches of ``RECORDS`` with the sink's writer into ``tmp_path/out``."""
    path = tmp_path / "out"
    write_output(str(path), monkeypatch)
    return path


def write_output(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write two batches of ``RECORDS`` with the sink's writer to the output at ``path``."""
    writer = PidfenceStreamWriter(SinkOptions.parse({"path": path}))
    for batch, (lo, hi) in enumerate(((0, 4), (4, len(RECORDS)))):
        monkeypatch.setattr(writer_mod, "_task_context", lambda b=batch: (b, 0, "query"))
        table = kafka_rows(RECORDS[lo:hi], lo)
        writer.commit([writer.write(iter(table.to_batches()))], batch)


def ledger_entries() -> list[LedgerEntry]:
    """Every record Kafka acknowledged (all of ``RECORDS`` with a header)."""
    from pidfence.wire import decode_pf

    out = []
    for offset, (header, value) in enumerate(RECORDS):
        if header is None:
            continue
        pf = decode_pf(header)
        out.append(
            LedgerEntry(
                pf.pid,
                pf.generation,
                TOPIC,
                0,
                pf.seq,
                value_digest(value),
                offset,
                1_000,
                fence=bool(pf.flags & FLAG_FENCE),
            )
        )
    return out


def write_ledger(path: Path, entries: list[LedgerEntry]) -> Path:
    """A ledger file holding ``entries``."""
    with LedgerWriter(path) as writer:
        for entry in entries:
            writer.write(entry)
    return path


def invoke(*args: str) -> tuple[int, str]:
    """Run ``pidfence verify ARGS``; returns the exit code and everything printed."""
    result = CliRunner().invoke(app, ["verify", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_clean_output_exits_0_with_a_table(tmp_path: Path, output: Path) -> None:
    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries())
    code, text = invoke("--ledger", str(ledger), "--output", str(output))
    assert code == 0, text
    for name in ("lost", "duplicate", "reordered", "zombie", "unexpected"):
        assert name in text
    assert "pidfence verify: ok" in text


def test_json_report_and_ledger_folder_and_several_ledgers(tmp_path: Path, output: Path) -> None:
    entries = ledger_entries()
    folder = tmp_path / "ledgers"
    write_ledger(folder / "a.jsonl", entries[:3])
    write_ledger(folder / "b.jsonl", entries[3:5])
    single = write_ledger(tmp_path / "c.jsonl", entries[5:])
    code, text = invoke(
        "--ledger", str(folder), "--ledger", str(single), "--output", str(output), "--json"
    )
    assert code == 0, text
    report = json.loads(text)
    assert report["ok"] is True
    assert report["totals"] == {
        "ledger": len(entries),
        "log": 6,
        "rejects": 3,
        "events": len({e.event_id for e in entries if not e.fence}),
    }
    assert {name: f["count"] for name, f in report["findings"].items()} == {
        "lost": 0,
        "duplicate": 0,
        "reordered": 0,
        "zombie": 0,
        "unexpected": 0,
        "event_duplicate": 0,
        "event_lost": 0,
        "expired": 0,
        "unacknowledged": 0,
        "superseded": 0,
        "foreign": 0,
        "deleted": 0,
        "updated": 0,
        "torn": 0,
        "upstream_gap": 0,
    }


def test_anomalies_exit_1_with_count_and_example(tmp_path: Path, output: Path) -> None:
    claimed = LedgerEntry(PID, GEN + 1, TOPIC, 0, 5, value_digest(b"v5"), 9, 1_000)
    ledger = write_ledger(tmp_path / "l.jsonl", [*ledger_entries(), claimed])
    code, text = invoke("--ledger", str(ledger), "--output", str(output), "--json")
    assert code == 1
    lost = json.loads(text)["findings"]["lost"]
    assert lost["count"] == 1
    assert lost["examples"][0]["seq"] == 5
    code, text = invoke("--ledger", str(ledger), "--output", str(output))
    assert code == 1
    assert "lost=1" in text


def test_unacknowledged_writes_alone_still_pass(tmp_path: Path, output: Path) -> None:
    # Neither the zombie nor its replacement lived to record seq 4's acknowledgement.
    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries()[:6])
    code, text = invoke("--ledger", str(ledger), "--output", str(output), "--json")
    assert code == 0, text
    assert json.loads(text)["findings"]["unacknowledged"]["count"] == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: ["--ledger", str(tmp / "none.jsonl"), "--output", str(tmp)], "none.jsonl"),
        (lambda tmp: ["--ledger", str(tmp / "l.jsonl"), "--output", str(tmp / "gone")], "gone"),
        (lambda tmp: ["--ledger", str(tmp / "empty"), "--output", str(tmp)], "no *.jsonl"),
        (lambda tmp: ["--ledger", str(tmp / "bad.jsonl"), "--output", str(tmp)], "bad.jsonl:1"),
    ],
    ids=["missing-ledger", "missing-output", "empty-ledger-folder", "malformed-ledger"],
)
def test_bad_input_exits_2_with_a_clear_message(tmp_path: Path, make: object, message: str) -> None:
    write_ledger(tmp_path / "l.jsonl", ledger_entries())
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.jsonl").write_text("{oops\n", encoding="utf-8")
    assert callable(make)
    code, text = invoke(*make(tmp_path))
    assert code == 2
    assert "pidfence verify: error:" in text
    assert message in text


@pytest.mark.parametrize(
    ("option", "args"),
    [
        ("--output", lambda ledger, out: ["--ledger", ledger, "--output", ""]),
        ("--ledger", lambda ledger, out: ["--ledger", "", "--output", out]),
        ("--ledger", lambda ledger, out: ["--ledger", ledger, "--ledger", "", "--output", out]),
        ("--rejects", lambda ledger, out: ["--ledger", ledger, "--output", out, "--rejects", ""]),
    ],
    ids=["output", "ledger", "second-ledger", "rejects"],
)
def test_an_empty_path_is_a_usage_error_naming_the_option(
    tmp_path: Path,
    output: Path,
    monkeypatch: pytest.MonkeyPatch,
    option: str,
    args: Callable[[str, str], list[str]],
) -> None:
    """Before: an empty --output was read as a store holding no table (exit 3), an empty
    --ledger as the working folder (here one holding a ledger: it was read)."""
    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries())
    monkeypatch.chdir(tmp_path)
    code, text = invoke(*args(str(ledger), str(output)))
    assert code == 2, text
    assert f"pidfence verify: error: {option} is empty" in text


def test_missing_required_option_is_a_usage_error(tmp_path: Path) -> None:
    code, _ = invoke("--output", str(tmp_path))
    assert code == 2


def test_verify_refuses_a_malformed_storage_option_as_a_usage_error(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("")
    args = ["verify", "--ledger", str(ledger), "--output", "s3://lake/out"]
    result = CliRunner().invoke(app, [*args, "--storage-option", "region"])
    assert result.exit_code == 2, result.output
    assert "AWS_REGION=eu-west-1" in result.output


def test_an_output_without_the_sinks_account_is_refused_not_judged_lost(
    tmp_path: Path, output: Path
) -> None:
    import shutil

    ledger = write_ledger(tmp_path / "l.jsonl", ledger_entries())
    shutil.rmtree(output / "_pidfence")  # copied without it, or deleted by hand
    code, text = invoke("--ledger", str(ledger), "--output", str(output))
    # Before: every row passed as another writer's, every record lost (exit 1).
    assert code == 3, text
    assert "_pidfence/" in text and "lost" not in text
