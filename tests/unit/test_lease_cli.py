"""``pidfence lease-server`` argument parsing (no server is started)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.cli.lease import parse_duration_ms, parse_listen


@pytest.mark.parametrize(
    ("text", "ms"),
    [("24h", 86_400_000), ("90s", 90_000), ("15m", 900_000), ("500ms", 500), ("2d", 172_800_000)],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "0s", "-5s", "1.5h", "10y", "h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="duration"):
        parse_duration_ms(text)


def test_listen() -> None:
    assert parse_listen("127.0.0.1:7070") == ("127.0.0.1", 7070)
    with pytest.raises(typer.BadParameter, match="HOST:PORT"):
        parse_listen("7070")


def test_bad_options_exit_with_usage_error() -> None:
    result = CliRunner().invoke(app, ["lease-server", "--zk", "h:1", "--lifetime", "forever"])
    assert result.exit_code == 2
    assert "duration" in result.output
    result = CliRunner().invoke(app, ["lease-server", "--zk", "h:1", "--log-format", "xml"])
    assert result.exit_code == 2
