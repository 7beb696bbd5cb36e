"""Threads that must not block: the asyncio producer's event loop.

The producer's few waits (a rollover's drain and lease call, a topic's first metadata request,
a full librdkafka queue) each ask :func:`may_block` first. Inside :func:`nonblocking` it raises
:class:`WouldBlock` instead, before anything was stamped or handed over (or after the step gave
its seq back), so the caller can run the same call again on a thread that may wait.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


class WouldBlock(Exception):
    """The call would wait, and this thread must not: run it again where waiting is fine."""


@contextmanager
def nonblocking() -> Iterator[None]:
    """Calls in this block, on this thread, raise :class:`WouldBlock` rather than wait."""
    outer = getattr(_local, "on", False)
    _local.on = True
    try:
        yield
    finally:
        _local.on = outer


def may_block() -> None:
    """Called before a wait: raises :class:`WouldBlock` inside :func:`nonblocking`."""
    if getattr(_local, "on", False):
        raise WouldBlock
