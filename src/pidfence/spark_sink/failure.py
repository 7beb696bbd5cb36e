"""Which error ended a streaming query: the sink's own, found inside Spark's exception.

The sink's code runs in Python workers; when it raises, Spark wraps the worker's traceback in a
``PythonException``, the failed job in a ``SparkException`` and the query's end in a
``StreamingQueryException``. What crosses the JVM is text, and Python writes every traceback's
last line as ``module.Class: message``: for a pidfence error, e.g.
``pidfence.spark_sink.delta.errors.RestoredPastSink: …``. :func:`failure_of` finds the last such
line, resolves the class (the same code on the driver and the workers) and returns that error
again, so callers decide by its ``retriable``, never by message text. A failure with no pidfence
error inside is Spark's own: :class:`SparkQueryFailed` (retriable: a rerun continues from the
checkpoint) unless it is one a rerun meets again (:class:`SparkQueryStopped`).
"""

from __future__ import annotations

import importlib
import re
from typing import ClassVar, Final

from pidfence.spark_sink.data_loss import DataLost, is_spark_data_loss
from pidfence.spark_sink.errors import SinkError
from pidfence.spark_sink.jvm_cause import explain
from pidfence.wire import PidfenceError

_CAUSE: Final = re.compile(r"^\s*(pidfence(?:\.\w+)+)\.(\w+): (.*)$", re.MULTILINE)
#: Spark failures that a rerun from the same checkpoint meets again.
_PERMANENT: Final = re.compile(
    r"INCOMPATIBLE_DATA_FOR_TABLE|"
    r"STREAM_FAILED.*(?:checkpoint|metadata) .*(?:corrupt|incompatible)",
    re.IGNORECASE,
)
#: What Spark may append to the message's line.
_SQLSTATE: Final = re.compile(r"\s*SQLSTATE: \w+\s*$")
_NOISE: Final = ("at ", "===", "JVM stacktrace", "Traceback", "File ")


class SparkQueryFailed(SinkError):
    """The query failed in Spark itself (no error of the sink's inside); a rerun continues from
    the checkpoint."""

    retriable: ClassVar[bool] = True


class SparkQueryStopped(SinkError):
    """The query failed in Spark in a way a rerun from the same checkpoint meets again (e.g.
    Kafka lost records the checkpoint points at)."""

    retriable: ClassVar[bool] = False


def _text(exc: BaseException) -> str:
    """Every message in the exception's chain (Spark's captured ones keep the JVM's text)."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(str(current))
        for attr in ("desc", "stackTrace"):
            value = getattr(current, attr, None)
            if isinstance(value, str):
                parts.append(value)
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def _resolve(module: str, name: str) -> type[PidfenceError] | None:
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    if isinstance(found, type) and issubclass(found, PidfenceError):
        return found
    return None


def cause_in(text: str) -> PidfenceError | None:
    """The last pidfence error named in a traceback text, rebuilt with its message."""
    found: PidfenceError | None = None
    for match in _CAUSE.finditer(text):
        cls = _resolve(match.group(1), match.group(2))
        if cls is None:
            continue
        error = cls.__new__(cls)
        Exception.__init__(error, _SQLSTATE.sub("", match.group(3)).strip())
        found = error
    return found


def first_line(text: str) -> str:
    """The first meaningful line of a (possibly Java) error message, at most 300 characters."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(_NOISE):
            return stripped[:300]
    return ""


def summary(exc: BaseException, text: str | None = None) -> str:
    """One line for an error: the JVM's root cause and its fix when ``text`` (default: the
    error's message) carries a Java stack, else its first meaningful line."""
    text = str(exc) if text is None else text
    return explain(text) or first_line(text) or type(exc).__name__


def failure_of(exc: BaseException) -> PidfenceError:
    """The error that ended a query: the sink's own if one is inside ``exc``, else Spark's.

    Args:
        exc: what ``query.exception()`` or ``awaitTermination()`` gave (or any exception).
    """
    current: BaseException | None = exc
    for _ in range(32):  # the chain, as far as it goes
        if current is None:
            break
        if isinstance(current, PidfenceError):
            return current
        current = current.__cause__ or current.__context__
    text = _text(exc)
    cause = cause_in(text)
    if cause is not None:
        return cause
    line = summary(exc, text)
    if is_spark_data_loss(text):
        return DataLost(
            "Kafka deleted records before the sink read them (retention overtook the sink): "
            f"{line}; rerun with --allow-data-loss to continue after them, with the gap reported"
        )
    if _PERMANENT.search(text):
        return SparkQueryStopped(
            f"the Spark query failed: {line}; running again from this checkpoint meets the same "
            "failure"
        )
    return SparkQueryFailed(
        f"the Spark query failed: {line}; running the same command again continues from the "
        "checkpoint"
    )


__all__ = ["SparkQueryFailed", "SparkQueryStopped", "cause_in", "failure_of", "first_line"]
