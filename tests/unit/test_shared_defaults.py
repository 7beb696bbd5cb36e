"""Defaults that must agree across components agree, and the docs show each one as declared.

The sink's entry lifetime must be at least the lease servers' lease lifetime, the producer's
recovery scan mirrors the sink's ``resolveGaps`` and ``timestampSkew``, and a resume without a
recorded lifetime assumes the servers' default: each pair was a literal written twice.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from fractions import Fraction
from pathlib import Path

import typer.main

from pidfence.cli import app
from pidfence.demo.config import DemoConfig
from pidfence.demo.start import DAY_MS
from pidfence.durations import parse_duration_ms
from pidfence.pid_allocator import LeaseServerSettings
from pidfence.producer import ProducerConfig
from pidfence.producer.copier import CopySpec
from pidfence.producer.loadgen import LoadSpec
from pidfence.spark_sink.options import SinkOptions

ROOT = Path(__file__).resolve().parents[2]


def test_the_sinks_defaults_are_what_producers_and_lease_servers_assume() -> None:
    sink = SinkOptions.parse({"path": "/tmp/out"})
    servers = LeaseServerSettings()
    producer = ProducerConfig("127.0.0.1:9092")
    assert sink.lifetime_ms == servers.lifetime_ms == producer.default_lifetime_ms == DAY_MS
    assert sink.grace_ms == producer.sink_timestamp_skew_ms
    assert sink.resolve_gaps is producer.sink_resolves_gaps


def test_every_duration_the_sink_options_table_shows_is_the_declared_default() -> None:
    shown = {
        f.metadata["name"]: (f.metadata["shown"], f.default)
        for f in fields(SinkOptions)
        if f.metadata and f.metadata["kind"] == "ms"
    }
    assert shown, "no duration option declared"
    for name, (text, default) in shown.items():
        assert parse_duration_ms(text.strip("`")) == default, name


def _cell_value(cell: str) -> object:
    """A default as docs/producer.md writes it: `True`, `"all"`, 1,000, 23/24, 24 h, `()`."""
    text = cell.strip().strip("`").replace(",", "")
    if text in ("True", "False"):
        return text == "True"
    if text.startswith('"'):
        return text.strip('"')
    if re.fullmatch(r"\d+/\d+", text):
        return Fraction(text)
    if re.fullmatch(r"\d+ [smhd]", text):
        return parse_duration_ms(text.replace(" ", ""))
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    return {"()": (), "{}": {}}.get(text, text)


def test_the_producer_settings_table_is_every_field_with_its_default() -> None:
    page = (ROOT / "docs" / "producer.md").read_text()
    section = page.split("## Settings (`ProducerConfig`)", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = {row.split("|")[1].strip().strip("`"): row.split("|")[2] for row in rows}
    declared = {f.name: f for f in fields(ProducerConfig)}
    assert table.keys() == declared.keys()
    for name, cell in table.items():
        f = declared[name]
        if f.default is MISSING and f.default_factory is MISSING:
            assert "required" in cell, name
            continue
        default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
        shown = _cell_value(cell)
        if isinstance(shown, Fraction):
            assert float(shown) == default, name
        else:
            assert shown == default, (name, cell)


#: Command options whose default is the library's, by (command, option) -> (type, field).
_SAME_AS: dict[tuple[str, str], tuple[type, str]] = {
    ("produce", "lifetime_rollover"): (ProducerConfig, "rollover_fraction"),
    ("copy", "session_timeout"): (CopySpec, "session_timeout_s"),
    ("copy", "idle_exit"): (CopySpec, "idle_exit_s"),
}
#: Options that differ on purpose: the demo's ``--faults all`` names the whole set, and a demo
#: without ``--seed`` draws one.
_DIFFER: frozenset[tuple[str, str]] = frozenset({("demo", "faults"), ("demo", "seed")})


def test_every_command_option_defaults_as_the_library_does() -> None:
    """``pidfence produce``, ``copy`` and ``demo`` write their defaults as literals (their
    modules load no component for ``--help``): each must be the dataclass's."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    checked = 0
    for command, spec in (("produce", LoadSpec), ("copy", CopySpec), ("demo", DemoConfig)):
        declared = {f.name: f for f in fields(spec)}
        for param in commands[command].params:
            key = (command, param.name)
            if key in _SAME_AS:
                owner, name = _SAME_AS[key]
                field = {f.name: f for f in fields(owner)}[name]
            elif param.name in declared and key not in _DIFFER:
                field = declared[param.name]
            else:
                continue
            if field.default is MISSING or param.default is None:
                continue  # required, or unset: nothing to agree on
            assert param.default == field.default, (command, param.name)
            checked += 1
    assert checked >= 20, checked
