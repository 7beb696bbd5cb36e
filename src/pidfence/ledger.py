"""The send ledger (DESIGN §8, §9): one line per record Kafka acknowledged, for the checker.

The producer writes it, ``pidfence verify`` and the simulation read it; it lives here, outside
both, so the producer does not import the checker. Format: JSON lines, one object per
acknowledgement::

    {"pid": 7, "generation": 3, "topic": "t", "partition": 0, "seq": 12,
     "digest": "9f86d081884c7d65", "offset": 1042, "ts_ms": 1763800000000, "fence": false,
     "expire_ms": 1763886400000, "event": "orders:3:1041"}

``ts_ms`` is the Kafka record timestamp (what the broker rules use as time); ``expire_ms`` is the
end of the lease the record was sent under (0 when unknown); ``digest`` is :func:`value_digest` of
the value. ``event`` names the upstream event the record carries (DESIGN §9): the caller's id
(``produce(..., event_id=...)``; the copier uses ``"topic:partition:offset"`` of the upstream
record), by default the value digest. Ledgers written before event ids existed have no ``event``:
it reads as the digest. Each producer process writes its own file; the checker reads any number.

Faults: a write that fails (disk full) raises :class:`LedgerWriteFailed` and leaves at most a torn
last line; a writer that opens such a file first ends the torn line, and :func:`read_ledger`
reports a torn line and skips it (its acknowledgement was never fully recorded).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Protocol

from pidfence.wire import PidfenceError

log = logging.getLogger(__name__)

#: errno values of a write that may succeed later (space freed, device back).
_TRANSIENT = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EINTR, errno.EBUSY}
)


class LedgerError(PidfenceError):
    """The send ledger could not be written or read; the message names the file and the fix."""


class LedgerWriteFailed(LedgerError):
    """A transient write failure (disk full, I/O error): free space, then resume the producer."""

    retriable = True


class LedgerRefused(LedgerError):
    """The ledger path cannot be used (permission, a folder, bad name): fix the path."""


def is_transient(exc: OSError) -> bool:
    """True when ``exc`` is transient (retriable): disk full, quota, I/O error, interrupted."""
    return exc.errno in _TRANSIENT


def value_digest(value: bytes | None) -> str:
    """A short, stable digest of a record value (16 hex chars of BLAKE2b)."""
    return hashlib.blake2b(value or b"", digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One acknowledged record.

    ``event`` is the upstream event id; empty means "the value digest" (see :attr:`event_id`).
    """

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
    event: str = ""

    @property
    def event_id(self) -> str:
        """The event this record carries: ``event``, or the value digest when none was given."""
        return self.event or self.digest


class Ledger(Protocol):
    """Where a producer records its acknowledgements: a :class:`LedgerWriter` (a file) or a
    :class:`MemoryLedger` (the simulation's)."""

    def write(self, entry: LedgerEntry) -> None:
        """Record one acknowledged record."""

    def flush(self) -> None:
        """Make what was written durable (called before a checkpoint is stored)."""

    def close(self) -> None:
        """Flush and release the ledger."""


class MemoryLedger:
    """A ledger kept in a list (``entries``, shared by every producer given the same list)."""

    def __init__(self, entries: list[LedgerEntry] | None = None) -> None:
        self.entries: list[LedgerEntry] = [] if entries is None else entries

    def write(self, entry: LedgerEntry) -> None:
        """Append one entry."""
        self.entries.append(entry)

    def flush(self) -> None:
        """Nothing to push: the list is the ledger."""

    def close(self) -> None:
        """Nothing to release."""


class LedgerWriter:
    """Appends entries to a ledger file; thread-safe (delivery callbacks may run anywhere).

    Raises (from the constructor and every method):
        LedgerWriteFailed: a transient I/O error (disk full); retriable.
        LedgerRefused: the path cannot be opened for appending.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] = self.path.open("a+", encoding="utf-8")
            self._end_torn_line()
        except OSError as exc:
            raise self._error("open", exc) from exc

    def _end_torn_line(self) -> None:
        # A predecessor killed (or out of space) mid-line left a fragment: end it, so this
        # writer's first entry starts on its own line and the fragment stays one torn line.
        size = self._file.seek(0, 2)
        if size == 0:
            return
        with self.path.open("rb") as raw:
            raw.seek(size - 1)
            last = raw.read(1)
        if last != b"\n":
            self._file.write("\n")
            self._file.flush()

    def _error(self, action: str, exc: OSError) -> LedgerError:
        cls = LedgerWriteFailed if is_transient(exc) else LedgerRefused
        return cls(
            f"could not {action} the send ledger {self.path}: {exc.strerror or exc}; "
            + (
                "free space (or fix the device), then resume from the last checkpoint"
                if cls is LedgerWriteFailed
                else "give a writable file path for the ledger"
            )
        )

    def write(self, entry: LedgerEntry) -> None:
        """Append one entry."""
        line = json.dumps(asdict(entry), separators=(",", ":"))
        with self._lock:
            try:
                self._file.write(line + "\n")
            except OSError as exc:
                raise self._error("write", exc) from exc

    def flush(self) -> None:
        """Push buffered entries to the OS (call before a checkpoint is saved)."""
        with self._lock:
            try:
                self._file.flush()
            except OSError as exc:
                raise self._error("write", exc) from exc

    def close(self) -> None:
        """Flush and close the file (closed even when the flush fails)."""
        with self._lock:
            if self._file.closed:
                return
            try:
                self._file.flush()
            except OSError as exc:
                raise self._error("write", exc) from exc
            finally:
                # The flush error above (if any) is the one to report; closing a file whose
                # buffer cannot be written fails the same way.
                with contextlib.suppress(OSError):
                    self._file.close()

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: ``on_torn(path, line_number)``: called for each torn line :func:`read_ledger` skips.
TornCallback = Callable[[Path, int], None]


def _warn_torn(path: Path, number: int) -> None:
    log.warning("ledger %s: line %d is torn (writer killed or disk full); skipped", path, number)


def read_ledger(
    paths: Iterable[str | Path], on_torn: TornCallback | None = _warn_torn
) -> Iterator[LedgerEntry]:
    """Entries from one or more ledger files (a folder means every ``*.jsonl`` in it).

    A torn line (a prefix of an entry: the writer was killed, or the disk filled, mid-write) is
    reported through ``on_torn`` (default: a warning) and skipped: that record's acknowledgement
    was never fully recorded, so it is not claimed as sent. Blank lines are skipped.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a complete line is not a ledger entry (the message names file and line).
    """
    for path in _expand(paths):
        with path.open(encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                entry = _parse(line, path, number)
                if entry is None:
                    if on_torn is not None:
                        on_torn(path, number)
                    continue
                yield entry


def ledger_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files :func:`read_ledger` reads for ``paths`` (a folder's ``*.jsonl``, sorted).

    Raises:
        FileNotFoundError: a path does not exist.
    """
    return list(_expand(paths))


def _parse(line: str, path: Path, number: int) -> LedgerEntry | None:
    text = line.strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # A torn line is a prefix of an entry: an object that never closes. Anything else
        # (a complete line that does not parse) is a corrupt ledger, not a torn write.
        if text.startswith('{"') and not text.endswith("}"):
            return None
        raise ValueError(f"{path}:{number}: not a ledger entry ({exc})") from exc
    try:
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
