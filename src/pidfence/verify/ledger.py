"""The send ledger (DESIGN §8): one line per record Kafka acknowledged, for the checker.

Format: JSON lines, one object per acknowledgement::

    {"pid": 7, "generation": 3, "topic": "t", "partition": 0, "seq": 12,
     "digest": "9f86d081884c7d65", "offset": 1042, "ts_ms": 1763800000000, "fence": false,
     "expire_ms": 1763886400000}

``ts_ms`` is the Kafka record timestamp (what the broker rules use as time); ``expire_ms`` is the
end of the lease the record was sent under (0 when unknown).

``digest`` is :func:`value_digest` of the record value. A record resent after a lost
acknowledgement may appear twice; the checker keys entries by (pid, topic, partition, seq).
Each producer process writes its own file; the checker reads any number of them.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO


def value_digest(value: bytes | None) -> str:
    """A short, stable digest of a record value (16 hex chars of BLAKE2b)."""
    return hashlib.blake2b(value or b"", digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One acknowledged record."""

    pid: int
    generation: int
    topic: str
    partition: int
    seq: int
    digest: str
    offset: int
    ts_ms: int
    fence: bool = False
    expire_ms: int = 0


class LedgerWriter:
    """Appends entries to a ledger file; thread-safe (delivery callbacks may run anywhere)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, entry: LedgerEntry) -> None:
        """Append one entry."""
        line = json.dumps(asdict(entry), separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def flush(self) -> None:
        """Push buffered entries to the OS (call before a checkpoint is saved)."""
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                self._file.close()

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_ledger(paths: Iterable[str | Path]) -> Iterator[LedgerEntry]:
    """Entries from one or more ledger files (a folder means every ``*.jsonl`` in it).

    A torn last line (the writer was SIGKILLed mid-write) is skipped: that record's
    acknowledgement was never fully recorded, so it is not claimed as sent. Blank lines are
    skipped.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a complete line is not a ledger entry (the message names file and line).
    """
    for path in _expand(paths):
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.endswith("\n"):
                    break
                if not line.strip():
                    continue
                yield _parse(line, path, number)


def ledger_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files :func:`read_ledger` reads for ``paths`` (a folder's ``*.jsonl``, sorted).

    Raises:
        FileNotFoundError: a path does not exist.
    """
    return list(_expand(paths))


def _parse(line: str, path: Path, number: int) -> LedgerEntry:
    try:
        data = json.loads(line)
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        return LedgerEntry(**data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}:{number}: not a ledger entry ({exc})") from exc


def _expand(paths: Iterable[str | Path]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted(path.glob("*.jsonl"))
        elif path.exists():
            yield path
        else:
            raise FileNotFoundError(f"ledger {path} does not exist")
