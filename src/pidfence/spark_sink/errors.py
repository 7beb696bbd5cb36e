"""Errors of the Spark sink: not retriable unless a class says so (``retriable``)."""

from __future__ import annotations

from typing import ClassVar

from pidfence.wire import PidfenceError


class SinkError(PidfenceError):
    """Base class of the sink's errors."""


class SinkOptionError(SinkError):
    """An option of ``format("pidfence")`` or of the pipeline helpers is invalid."""


class SplitPartitionError(SinkError):
    """One Kafka partition's records reached two tasks of one batch, or came to one task
    interleaved with another partition's (a shuffled stream); nothing was published."""


class OutputOwnedError(SinkError):
    """Another streaming query owns the output path (one query per path: DESIGN §7).

    Stop that query or write to another path; a restart of the same query (same checkpoint)
    takes the path over.
    """


class ManifestUnreadable(SinkError):
    """A batch manifest or positions index of the sink's own folder that this version cannot
    read: another version wrote it, or it is damaged. Not retriable: a rerun reads it again."""


class CommittedBatchMismatch(SinkError):
    """Spark re-ran a committed batch with other Kafka offsets than its manifest records.

    A committed batch is immutable; this means the checkpoint and the output path disagree
    (e.g. a checkpoint from another run). Nothing was written.
    """


class OutputStoreFailed(SinkError):
    """The output's store failed a request of the driver's around the query (no answer, or a
    refusal); the committed batches are kept and running again continues."""

    retriable: ClassVar[bool] = True


def store_failed(output: str, step: str, exc: OSError) -> OutputStoreFailed:
    """``exc`` from the store of ``output`` while the driver did ``step``, as one line."""
    cause = " ".join(str(exc).split()) or type(exc).__name__
    return OutputStoreFailed(
        f"the store of {output} failed {step}: {cause}; the committed batches are kept, and "
        "running the same command again continues"
    )
