"""Errors of the broker-side rules."""

from __future__ import annotations

from pidfence.wire import PidfenceError


class CorruptSnapshot(PidfenceError):
    """A state snapshot failed its checks; fall back to an older snapshot or a full replay."""
