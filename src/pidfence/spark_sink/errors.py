"""Errors of the Spark sink."""

from __future__ import annotations

from typing import ClassVar

from pidfence.wire import PidfenceError


class SinkError(PidfenceError):
    """Base class of the sink's errors."""

    retriable: ClassVar[bool] = False


class SinkOptionError(SinkError):
    """An option of ``format("pidfence")`` or of the pipeline helpers is invalid."""

    retriable: ClassVar[bool] = False


class SplitPartitionError(SinkError):
    """One Kafka partition's records reached two tasks of one batch; nothing was published."""

    retriable: ClassVar[bool] = False


class InjectedFault(SinkError):
    """A failure injected on purpose by ``PIDFENCE_SINK_FAIL_ATTEMPT0`` (a retry succeeds)."""

    retriable: ClassVar[bool] = True
