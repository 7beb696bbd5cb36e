"""The checker's reading of send ledgers: every field typed, torn lines counted, none empty.

:func:`pidfence.ledger.read_ledger` builds entries from whatever JSON a line holds and only logs
torn lines; a proof cannot. Here a line whose fields have the wrong types (``"fence": "false"``
is truthy in Python and would make a loss invisible) is a :class:`VerifyInputError` naming
``file:line``, and every torn line is kept (``file:line``) for the report's ``torn`` count.

Torn lines: a line that is a prefix of an entry (an object that never closes) is what a writer
killed mid-line (or out of space) leaves. The last line of a file is where that happens; a
writer that later opens the same file ends the fragment with a newline and appends below it
(:class:`pidfence.ledger.LedgerWriter`), so a torn line inside a file is a crash that a resumed
producer continued after, not damage. Either way the acknowledgement was never fully recorded:
the record is not claimed as sent (an appended copy reads as ``unacknowledged``), and every torn
line is listed under ``torn``. A complete line that is not an entry is a damaged ledger: an error.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from pidfence.ledger import LedgerEntry
from pidfence.verify.errors import VerifyInputError

#: Each field's JSON type (``bool`` is no ``int`` here: ``"pid": true`` is refused).
FIELD_TYPES: Final[dict[str, type]] = {
    "pid": int,
    "generation": int,
    "topic": str,
    "partition": int,
    "seq": int,
    "digest": str,
    "offset": int,
    "ts_ms": int,
    "fence": bool,
    "expire_ms": int,
    "event": str,
}
_REQUIRED: Final = frozenset(
    f.name for f in fields(LedgerEntry) if f.default is MISSING and f.default_factory is MISSING
)


@dataclass(slots=True)
class LedgerRead:
    """What the ledger files held: the entries, and ``file:line`` of each torn line."""

    entries: list[LedgerEntry] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)


def type_problem(values: dict[str, Any]) -> str | None:
    """What is wrong with one entry's fields (unknown, missing or mistyped), or None."""
    unknown = sorted(set(values) - set(FIELD_TYPES))
    if unknown:
        return f"unknown field(s) {unknown}"
    missing = sorted(_REQUIRED - set(values))
    if missing:
        return f"missing field(s) {missing}"
    for name, value in values.items():
        want = FIELD_TYPES[name]
        if type(value) is not want:  # exact: True is not an int, 1 is not a bool
            return f"field {name!r} is {json.dumps(value)}, not a JSON {_json_type(want)}"
    return None


def entry_problem(entry: LedgerEntry) -> str | None:
    """What is wrong with the types of an entry built in Python (``check()``'s callers), or
    None; integers of any integral type (numpy's too) and numpy booleans are fine."""
    for f in fields(LedgerEntry):
        value = getattr(entry, f.name)
        want = FIELD_TYPES[f.name]
        is_bool = isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")
        if want is bool:
            ok = is_bool
        elif want is int:
            ok = isinstance(value, numbers.Integral) and not is_bool
        else:
            ok = isinstance(value, want)
        if not ok:
            return f"field {f.name!r} is {value!r} ({type(value).__name__}), not {want.__name__}"
    return None


def _json_type(kind: type) -> str:
    return {int: "integer", str: "string", bool: "boolean (true/false)"}[kind]


def read_ledgers(files: Iterable[Path]) -> LedgerRead:
    """Every entry of ``files`` (in order) and every torn line.

    Raises:
        VerifyInputError: a file cannot be read, a complete line is not a ledger entry or has a
            field of the wrong type (the message names ``file:line``), or no file holds a single
            data entry (an empty ledger, or one of FENCEs only, proves nothing: every output
            would pass against it).
    """
    read = LedgerRead()
    names = []
    for path in files:
        names.append(str(path))
        try:
            with path.open(encoding="utf-8", errors="replace") as handle:
                for number, line in enumerate(handle, start=1):
                    _line(read, line, path, number)
        except OSError as exc:
            raise VerifyInputError(f"cannot read the ledger {path}: {exc}") from exc
    if not read.entries:
        torn = f" ({len(read.torn)} torn line(s) only)" if read.torn else ""
        raise VerifyInputError(
            f"the ledger holds no entry{torn}: {', '.join(names) or 'no file'}; an empty ledger "
            "proves nothing (name the --ledger the producers wrote)"
        )
    if all(entry.fence for entry in read.entries):
        raise VerifyInputError(
            f"the ledger holds FENCE entries only ({len(read.entries)}): {', '.join(names)}; "
            "no data record was acknowledged, so it proves nothing (name the --ledger the "
            "producers wrote their records to)"
        )
    return read


def _line(read: LedgerRead, line: str, path: Path, number: int) -> None:
    text = line.strip()
    if not text:
        return
    where = f"{path}:{number}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # The rule of pidfence.ledger: a prefix of an entry is torn, anything else is corrupt.
        if text.startswith('{"') and not text.endswith("}"):
            read.torn.append(where)
            return
        raise VerifyInputError(f"{where}: not a ledger entry ({exc})") from exc
    if not isinstance(data, dict):
        raise VerifyInputError(f"{where}: not a ledger entry (a JSON {type(data).__name__})")
    problem = type_problem(data)
    if problem is not None:
        raise VerifyInputError(f"{where}: not a ledger entry: {problem}")
    read.entries.append(LedgerEntry(**data))


__all__ = ["FIELD_TYPES", "LedgerRead", "entry_problem", "read_ledgers", "type_problem"]
