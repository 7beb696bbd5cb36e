"""Errors of the checker: inputs it cannot read. Anomalies are findings, never errors."""

from __future__ import annotations

from typing import ClassVar

from pidfence.wire import PidfenceError


class VerifyInputError(PidfenceError, ValueError):
    """A ledger or an output the checker was given is missing, unreadable or not what it
    expects; the message names it and the fix (a ``ValueError`` too, for older callers)."""

    retriable: ClassVar[bool] = False


class OutputUnreadable(PidfenceError):
    """The output exists but reading it failed (damaged files, a storage error)."""

    retriable: ClassVar[bool] = False


__all__ = ["OutputUnreadable", "VerifyInputError"]
