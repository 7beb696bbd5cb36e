"""``pidfence produce --state``: a resume repeats the options that shape each record, or is
refused naming the one that differs (issue 43: a resume at another ``--rate`` re-sent records
with other timestamps, and verify reported them lost and unexpected)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pidfence.producer.errors import BadCheckpoint
from pidfence.producer.loadgen import STATE_VERSION, LoadGenerator, LoadSpec
from pidfence.producer.statefile import save_state

SPEC = LoadSpec(name="p", topic="t", count=10, value_size=50, keys=3, rate=100.0)


class Opened(Exception):
    """The generator got past its state file and asked for a producer."""


def _open(_checkpoint: Any) -> Any:
    raise Opened


def _state(path: Path, **options: object) -> None:
    written = {"name": "p", "keys": 3, "value-size": 50, "rate": 100.0, **options}
    save_state(
        path,
        {"v": STATE_VERSION, "topic": "t", "next_i": 5, "start_ms": 1, "checkpoint": None}
        | written,
    )


def test_the_same_options_resume(tmp_path: Path) -> None:
    _state(tmp_path / "s.json")
    with pytest.raises(Opened):
        LoadGenerator(SPEC, _open, tmp_path / "s.json").run()


@pytest.mark.parametrize(
    ("option", "changed"),
    [("rate", {"rate": 50.0}), ("keys", {"keys": 4}), ("value-size", {"value_size": 10})],
)
def test_another_record_shaping_option_is_refused_naming_it(
    tmp_path: Path, option: str, changed: dict[str, Any]
) -> None:
    _state(tmp_path / "s.json")
    with pytest.raises(BadCheckpoint, match=f"written with --{option} ") as failed:
        LoadGenerator(replace(SPEC, **changed), _open, tmp_path / "s.json").run()
    assert not failed.value.retriable
