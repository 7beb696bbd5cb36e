"""How ``pidfence produce`` and ``pidfence copy`` report errors: a clear line, a meaningful exit."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pidfence.wire import PidfenceError

#: Exit code of a retriable failure (EX_TEMPFAIL): a supervisor may restart the command.
EXIT_RETRIABLE = 75
#: Exit code of any other failure (README's table: a set-up that cannot work, e.g. a missing
#: topic, or a producer fenced by its replacement).
EXIT_FAILED = 3


@contextmanager
def fail_cleanly() -> Iterator[None]:
    """Turn a :class:`PidfenceError` into one stderr line and exit 75 (retriable) or 3."""
    try:
        yield
    except PidfenceError as exc:
        kind = "retriable" if exc.retriable else "error"
        sys.stderr.write(f"pidfence: {kind}: {type(exc).__name__}: {exc}\n")
        raise SystemExit(EXIT_RETRIABLE if exc.retriable else EXIT_FAILED) from exc
