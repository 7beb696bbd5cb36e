"""The root cause of a failure inside Spark's JVM, as one line a user can act on.

py4j and Spark wrap a Java failure in layers (``An error occurred while calling o77.start``, a
``StreamingQueryException``, a ``SparkException``); its cause is at the bottom of the Java stack
trace the Python exception carries as text: the last ``Caused by:`` line, or the first exception
line when nothing is chained. :func:`root_cause` finds it (class and message), :func:`explain`
adds the fix for the failures object stores bring (a missing connector, a bucket, credentials,
an endpoint).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

#: A Java exception's line in a stack trace: ``[Caused by: |: ]pkg.Class[: message]``.
_THROWN: Final = re.compile(
    r"^(?:Caused by: |: )?((?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error|Throwable))"
    r"(?:: (.*))?$",
    re.MULTILINE,
)
#: The fix for a store that did not answer.
_NO_ANSWER: Final = "the store did not answer: check AWS_ENDPOINT_URL and that the store runs"
#: What a cause means, and its fix: the first pattern found in the failure's text decides.
_FIXES: Final = (
    (
        r"S3AFileSystem not found|No FileSystem for scheme \"?s3a?\b",
        "Spark has no hadoop-aws jars: `pidfence sink` adds them for s3:// paths; a session of "
        "your own gets them from pidfence.spark_sink.configure(builder, object_store=True)",
    ),
    (
        r"NoSuchBucket|[Bb]ucket \S+ does not exist|UnknownStoreException",
        "create the bucket first, or correct the bucket in the path",
    ),
    (
        r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|Status Code: 403|403 Forbidden",
        "the store refused the credentials: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    ),
    (
        r"UnknownHostException|ConnectException|Connection refused|Unable to execute HTTP|"
        r"Could not connect to the endpoint",
        _NO_ANSWER,
    ),
)
#: Where a JVM failure names the object store: only then is a refused connection the store's
#: (a Spark master or YARN refuses connections too).
_STORE: Final = re.compile(r"s3a?://|S3A|amazonaws|awssdk")


@dataclass(frozen=True)
class JvmCause:
    """A Java exception: its class (fully qualified) and message."""

    cls: str
    message: str

    def __str__(self) -> str:
        name = self.cls.rpartition(".")[2]
        return f"{name}: {self.message}" if self.message else name


def root_cause(text: str) -> JvmCause | None:
    """The deepest Java exception named in a failure's text (None when it names none)."""
    found = list(_THROWN.finditer(text))
    if not found:
        return None
    chained = [m for m in found if m.group(0).startswith("Caused by: ")]
    match = (chained or found)[-1]
    return JvmCause(match.group(1), (match.group(2) or "").strip()[:300])


def fix_for(text: str) -> str | None:
    """The fix for a failure whose text shows a known cause, else None."""
    for pattern, fix in _FIXES:
        if re.search(pattern, text):
            return fix
    return None


def explain(text: str) -> str | None:
    """``Class: message; fix`` for a failure's text, or None when no Java exception is in it."""
    cause = root_cause(text)
    if cause is None or cause.cls.endswith("PythonException"):
        return None  # Python's own traceback: the caller reads it
    fix = fix_for(text)
    if fix == _NO_ANSWER and not _STORE.search(text):
        fix = None
    return f"{cause}; {fix}" if fix else str(cause)


__all__ = ["JvmCause", "explain", "fix_for", "root_cause"]
