"""The exception root shared by every pidfence package."""

from __future__ import annotations

from typing import ClassVar


class PidfenceError(Exception):
    """Root of every error pidfence raises on purpose.

    ``retriable`` is a class attribute: retry loops look at it, never at the message text.
    """

    retriable: ClassVar[bool] = False


class MalformedHeader(PidfenceError, ValueError):
    """A ``pf`` header that is not a valid version-1 header (or values that cannot make one)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed pf header: {reason}")
        self.reason = reason
