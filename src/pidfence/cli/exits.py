"""The exit codes every ``pidfence`` command follows (the table in the README), the one table
that maps errors to them, and one way to turn an error into one clear stderr line.

====  =====================================================================================
code  meaning
====  =====================================================================================
0     done; for checks: no anomaly
1     anomalies found (``verify``, ``demo``): the run itself worked, its verdict is "no"
2     usage: an unknown option, a bad value, a missing file named on the command line
3     cannot reach a server, or a configuration that cannot work (missing topic, read-only path,
      an extra, Java or a jar missing: the line names the fix)
75    retriable (``EX_TEMPFAIL``): run the same command again later, it continues
====  =====================================================================================
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, NoReturn

import typer

from pidfence.wire import PidfenceError

EXIT_OK = 0
EXIT_ANOMALIES = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_RETRIABLE = 75

#: The one map from error classes to exit codes, for every command: the most derived class of
#: an error that it names decides. Any other :class:`PidfenceError` exits 75 when its class is
#: ``retriable`` (running the same command again continues), else 3. Classes are named, not
#: imported, so ``pidfence --help`` loads no component (a unit test resolves every name).
EXIT_BY_ERROR: Final[dict[str, int]] = {
    # A bad option value, caught where it is validated.
    "pidfence.spark_sink.errors.SinkOptionError": EXIT_USAGE,
    # A ledger or output path named on the command line that is missing or unreadable.
    "pidfence.verify.errors.VerifyInputError": EXIT_USAGE,
    # A producer setting given on the command line that cannot work (--lifetime-rollover 1.5).
    "pidfence.producer.errors.ProducerConfigError": EXIT_USAGE,
    # A key file named on the command line (--lease-public-key) missing or not a key.
    "pidfence.wire.cert.KeyFileError": EXIT_USAGE,
    # A --lease-server list that is not HOST:PORT[,...] (a port left out).
    "pidfence.pid_allocator.errors.InvalidServerList": EXIT_USAGE,
}


def fail(command: str, message: str, code: int = EXIT_UNAVAILABLE) -> NoReturn:
    """Print ``pidfence COMMAND: error: MESSAGE`` on stderr and exit with ``code``."""
    kind = "retriable" if code == EXIT_RETRIABLE else "error"
    sys.stderr.write(f"pidfence {command}: {kind}: {message}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def code_of(exc: BaseException) -> int:
    """The exit code of an error by :data:`EXIT_BY_ERROR`: 2 for the usage errors it names,
    else 75 when retriable, else 3."""
    for cls in type(exc).__mro__:
        code = EXIT_BY_ERROR.get(f"{cls.__module__}.{cls.__qualname__}")
        if code is not None:
            return code
    return EXIT_RETRIABLE if getattr(exc, "retriable", False) else EXIT_UNAVAILABLE


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its class name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def exit_cleanly(command: str) -> Iterator[None]:
    """Turn a :class:`PidfenceError` escaping the block into one line and its exit code."""
    try:
        yield
    except PidfenceError as exc:
        fail(command, first_line(exc), code_of(exc))
