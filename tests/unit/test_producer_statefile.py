"""State files (issue 12 finding 9): every failure is a PidfenceError with the right flag."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from pidfence.producer import (
    BadCheckpoint,
    ProducerCheckpoint,
    StateFileRefused,
    StateStorageFailed,
    statefile,
)
from pidfence.producer.statefile import load_state, save_state


def test_state_file_round_trips_with_mode_0600_and_no_tmp(tmp_path: Path) -> None:
    cp = ProducerCheckpoint(7, 3, 99, {("t", 0): 4}, 10, secret=b"\x01\x02", taken_ms=5)
    path = tmp_path / "s.json"
    save_state(path, {"checkpoint": cp.to_dict()})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ProducerCheckpoint.from_dict(load_state(path)["checkpoint"]) == cp  # type: ignore[index]
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
    assert "01" not in repr(cp) and "secret" not in repr(cp)


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe\x00binary", b"[" * 100_000 + b"]" * 100_000, b"[1, 2]", b"{"],
    ids=["binary", "deeply-nested", "not-an-object", "torn"],
)
def test_bad_state_file_is_a_bad_checkpoint(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(BadCheckpoint) as info:
        load_state(path)
    assert not info.value.retriable


def test_state_path_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StateFileRefused, match="not a folder") as info:
        load_state(tmp_path)
    assert not info.value.retriable
    with pytest.raises(StateFileRefused):
        save_state(tmp_path, {"v": 1})
    assert list(tmp_path.iterdir()) == []


def test_full_disk_is_retriable_and_leaves_old_state_and_no_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.json"
    save_state(path, {"v": 1})

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StateStorageFailed, match="intact") as info:
        save_state(path, {"v": 2})
    assert info.value.retriable
    monkeypatch.undo()
    assert load_state(path) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_checkpoint_secret_must_be_hex() -> None:
    data = ProducerCheckpoint(7, 3, 99).to_dict()
    data["secret"] = "zz"  # noqa: S105 - not hex, on purpose
    with pytest.raises(BadCheckpoint):
        ProducerCheckpoint.from_dict(data)


def test_a_state_file_of_the_largest_size_is_read_and_a_larger_one_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statefile, "MAX_STATE_BYTES", 32)
    path = tmp_path / "s.json"
    path.write_text('{"checkpoint": "' + "x" * 14 + '"}')  # 32 bytes
    assert load_state(path) == {"checkpoint": "x" * 14}
    path.write_text('{"checkpoint": "' + "x" * 15 + '"}')
    with pytest.raises(BadCheckpoint, match="larger than 32 bytes"):
        load_state(path)
