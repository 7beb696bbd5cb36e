"""Atomic JSON state files: write a temporary file, fsync it, rename it over the old one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pidfence.producer.errors import BadCheckpoint


def save_state(path: str | Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically: a reader (or a restart after SIGKILL)
    sees the old file or the new one, never a torn one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(data, handle, separators=(",", ":"))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    # The rename is durable only once the directory entry is.
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_state(path: str | Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when the file does not exist.

    Raises:
        BadCheckpoint: the file exists but is not a JSON object.
    """
    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadCheckpoint(
            f"state file {target} is not JSON ({exc}); restore a good copy or delete it to start "
            "afresh (a fresh start re-sends everything under a new pid)"
        ) from exc
    if not isinstance(data, dict):
        raise BadCheckpoint(f"state file {target} does not hold a JSON object")
    return data
