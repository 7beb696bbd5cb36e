"""The exit codes every ``pidfence`` command follows (the table in the README), and one way to
turn an error into one clear stderr line.

====  =====================================================================================
code  meaning
====  =====================================================================================
0     done; for checks: no anomaly
1     anomalies found (``verify``, ``demo``): the run itself worked, its verdict is "no"
2     usage: an unknown option, a bad value, a missing file named on the command line
3     cannot reach a server, or a configuration that cannot work (missing topic, read-only path)
75    retriable (``EX_TEMPFAIL``): run the same command again later, it continues
====  =====================================================================================
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer

from pidfence.wire import PidfenceError

EXIT_OK = 0
EXIT_ANOMALIES = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_RETRIABLE = 75


def fail(command: str, message: str, code: int = EXIT_UNAVAILABLE) -> NoReturn:
    """Print ``pidfence COMMAND: error: MESSAGE`` on stderr and exit with ``code``."""
    kind = "retriable" if code == EXIT_RETRIABLE else "error"
    sys.stderr.write(f"pidfence {command}: {kind}: {message}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def code_of(exc: PidfenceError) -> int:
    """The exit code of a pidfence error: 75 when retriable, else 3."""
    return EXIT_RETRIABLE if exc.retriable else EXIT_UNAVAILABLE


@contextmanager
def exit_cleanly(command: str) -> Iterator[None]:
    """Turn a :class:`PidfenceError` escaping the block into one line and its exit code."""
    try:
        yield
    except PidfenceError as exc:
        fail(command, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
             code_of(exc))  # fmt: skip
