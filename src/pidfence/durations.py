"""Durations as people write them: ``500ms``, ``90s``, ``15m``, ``24h``, ``7d`` or bare
milliseconds. One reader for every command, setting and sink option, so ``30s`` means the same
everywhere."""

from __future__ import annotations

import re
from typing import Final

UNITS_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION: Final = re.compile(r"\s*(\d+)\s*(ms|s|m|h|d)?\s*")


def parse_duration_ms(text: str, low: int = 1) -> int:
    """``text`` in milliseconds, at least ``low`` once its unit is applied (``30s`` passes a
    minimum of 1000).

    Raises:
        ValueError: not a whole duration, or shorter than ``low``; the message names both.
    """
    match = _DURATION.fullmatch(text)
    value = None if match is None else int(match.group(1)) * UNITS_MS[match.group(2) or "ms"]
    if value is None:
        raise ValueError(f"{text!r} is not a duration like 24h, 90s, 15m or 500ms")
    if value < low:
        raise ValueError(
            f"{text!r} is a duration shorter than {format_duration_ms(low)}, the least"
        )
    return value


def format_duration_ms(ms: float) -> str:
    """``ms`` in the largest unit that holds it whole: ``86400000`` -> ``"1d"``, ``90000`` ->
    ``"90s"`` (what :func:`parse_duration_ms` reads back)."""
    ms = round(ms)
    for unit in ("d", "h", "m", "s"):
        size = UNITS_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
