"""Atomic JSON state files: write a temporary file, fsync it, rename it over the old one.

State files hold producer checkpoints, and checkpoints hold the pid's ``secret``: they are
written with mode 0600. Every failure is a :class:`~pidfence.wire.PidfenceError` with the right
``retriable`` flag, and a failed write leaves no temporary file and the old state intact.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from pidfence.ledger import is_transient
from pidfence.producer.errors import BadCheckpoint, StateFileRefused, StateStorageFailed

#: Read at most this much: a state file is a few KiB; anything huge is not one.
MAX_STATE_BYTES = 16 * 1024 * 1024


def _io_error(action: str, target: Path, exc: OSError) -> StateStorageFailed | StateFileRefused:
    if is_transient(exc):
        return StateStorageFailed(
            f"could not {action} state file {target}: {exc.strerror or exc}; free space (or fix "
            "the device) and retry: the previous state file is intact"
        )
    return StateFileRefused(
        f"could not {action} state file {target}: {exc.strerror or exc}; give a writable file "
        "path (not a folder) as --state"
    )


def save_state(path: str | Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically, mode 0600.

    A reader (or a restart after SIGKILL) sees the old file or the new one, never a torn one.

    Raises:
        StateStorageFailed: disk full or an I/O error (retriable); the old file is intact.
        StateFileRefused: the path cannot be written (a folder, no permission).
    """
    target = Path(path)
    text = json.dumps(data, separators=(",", ":"))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            raise IsADirectoryError(21, "Is a directory", str(target))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o600)  # an older tmp of this pid may have had another mode
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        # The rename is durable only once the directory entry is.
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise _io_error("write", target, exc) from exc


def load_state(path: str | Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when the file does not exist.

    Raises:
        BadCheckpoint: the file exists but is not a JSON object (binary, too deep, too large).
        StateStorageFailed: a transient I/O error (retriable).
        StateFileRefused: the path is a folder or unreadable.
    """
    target = Path(path)
    try:
        with target.open("rb") as handle:
            raw = handle.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _io_error("read", target, exc) from exc
    fix = "restore a good copy or delete it to start afresh (a fresh start re-sends everything)"
    if len(raw) > MAX_STATE_BYTES:
        raise BadCheckpoint(f"state file {target} is larger than {MAX_STATE_BYTES} bytes; {fix}")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # UnicodeDecodeError is a ValueError; RecursionError comes from absurd nesting.
        raise BadCheckpoint(
            f"state file {target} is not JSON ({type(exc).__name__}); {fix}"
        ) from exc
    if not isinstance(data, dict):
        raise BadCheckpoint(f"state file {target} does not hold a JSON object; {fix}")
    return data
