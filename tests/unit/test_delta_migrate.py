"""``pidfence sink migrate``: a Delta output of table format 1 opens with the migrate line,
migrates to format 2, and the sink continues it exactly (state rebuilt from its decisions)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.spark_sink.delta.errors import OldTableFormat
from pidfence.spark_sink.delta.layout import DeltaLayout, open_layout
from pidfence.spark_sink.delta.migrate import migrate_output
from pidfence.spark_sink.delta.table import FORMAT_KEY, FORMAT_VERSION
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.readers import read_log, read_rejects
from pidfence.spark_sink.writer import PidfenceStreamWriter
from pidfence.wire import encode_pf
from tests.unit.test_delta_layout import QUERY, SETTINGS, _write
from tests.unit.test_sink_process import make_stream, micro_batches, reference

RULES = {"capacity": 64, "lifetime_ms": 10_000_000, "reorder_window": 3}


def _old_columns(table: pa.Table) -> pa.Table:
    table = table.drop_columns(["timestampType", "headers"])
    return table.rename_columns(
        ["kafka_offset" if n == "offset" else n for n in table.column_names]
    )


def _as_format_1(path: Path) -> None:
    """Turn a format-2 output into what the previous version wrote: ``kafka_offset``, no
    ``timestampType``/``headers``, ``pf`` and ``batch`` in the rejects, no decisions files."""
    layout = DeltaLayout(str(path), str(path / "_rejects"), QUERY)
    batch_of: dict[int, int] = {}
    for bid in layout.committed_ids():
        for part in layout.committed(bid)["parts"]:  # type: ignore[index]
            decided = layout.read_decided(bid, part)
            assert decided is not None
            for offset in decided.filter(decided["verdict"].is_valid())["offset"].to_pylist():
                batch_of[offset] = bid
    log = _old_columns(DeltaTable(str(path)).to_pyarrow_table())
    rejects = DeltaTable(str(path / "_rejects")).to_pyarrow_table()
    pf = [
        encode_pf(p, g, s) if p else b"\x07garbage"
        for p, g, s in zip(
            rejects["pid"].to_pylist(),
            rejects["generation"].to_pylist(),
            rejects["seq"].to_pylist(),
            strict=True,
        )
    ]
    batches = [batch_of[o] for o in rejects["offset"].to_pylist()]
    old_rejects = (
        _old_columns(rejects)
        .append_column("pf", pa.array(pf, pa.binary()))
        .append_column("batch", pa.array(batches, pa.int64()))
    )
    for root, rows in ((path, log), (path / "_rejects", old_rejects)):
        write_deltalake(str(root), rows, mode="overwrite", schema_mode="overwrite")
        DeltaTable(str(root)).alter.set_table_properties(
            {FORMAT_KEY: "1"}, raise_if_not_exists=False
        )
    shutil.rmtree(path / "_pidfence" / "_decided")
    for manifest in (path / "_pidfence" / "_manifests").glob("*.json"):
        data = json.loads(manifest.read_text())
        for part in data["parts"]:
            part["files"].pop("decided", None)
        manifest.write_text(json.dumps(data))


def test_an_old_output_migrates_and_the_sink_continues_it_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = SinkOptions.parse({"path": str(tmp_path), **SETTINGS})
    open_layout(options.path, options.rejects_path, QUERY)
    writer = PidfenceStreamWriter(options)
    records = make_stream(23, 400)
    chunks = micro_batches(records, 50)
    half = len(chunks) // 2
    for b, chunk in enumerate(chunks[:half]):
        writer.commit([_write(monkeypatch, writer, b, chunk)], b)
    decided_before = sorted(p.name for p in (tmp_path / "_pidfence" / "_decided").rglob("*"))
    _as_format_1(tmp_path)
    with pytest.raises(OldTableFormat, match=f"pidfence sink migrate {tmp_path}"):
        open_layout(options.path, options.rejects_path, QUERY)
    assert read_log(str(tmp_path)).num_rows > 0  # readers still read the old format
    result = CliRunner().invoke(app, ["sink", "migrate", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "decisions file(s)" in result.output and "rows rewritten" in result.output
    assert sorted(p.name for p in (tmp_path / "_pidfence" / "_decided").rglob("*")) == (
        decided_before
    )
    for root in (tmp_path, tmp_path / "_rejects"):
        assert DeltaTable(str(root)).metadata().configuration[FORMAT_KEY] == FORMAT_VERSION
    assert migrate_output(str(tmp_path)).human().startswith("nothing to migrate")
    # Every state file lost too: the next batches rebuild state from the decisions files.
    shutil.rmtree(tmp_path / "_pidfence" / "_state")
    open_layout(options.path, options.rejects_path, QUERY)
    writer = PidfenceStreamWriter(options)
    for b, chunk in enumerate(chunks[half:], start=half):
        writer.commit([_write(monkeypatch, writer, b, chunk)], b)
    expected, dropped = reference(records, **RULES)
    log = read_log(str(tmp_path))
    assert log["offset"].to_pylist() == expected
    assert log["log_offset"].to_pylist() == list(range(len(expected)))
    old = log.filter(pa.compute.is_null(log["headers"]))
    assert 0 < old.num_rows < log.num_rows  # migrated rows have no headers; new ones do
    rejects = read_rejects(str(tmp_path))
    got = dict(zip(rejects["offset"].to_pylist(), rejects["verdict"].to_pylist(), strict=True))
    assert got == {k: v for k, v in dropped.items() if k <= records[-1][0]}
