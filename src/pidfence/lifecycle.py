"""What every started-and-stopped thing shares: ``with thing:`` starts it and always stops it,
and a signal that stops a command unwinds it like Ctrl-C (:func:`signals_raise`).

Kept outside the layers (it imports nothing of pidfence) so that the lease server's thread, the
services' process groups and the commands that start them use one definition.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Self


class Startable(ABC):
    """A thing with ``start()`` (returning itself once ready) and ``stop()`` (idempotent)."""

    @abstractmethod
    def start(self) -> Self:
        """Start and return once ready."""

    @abstractmethod
    def stop(self) -> None:
        """Stop (a no-op when not started)."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def signals_raise(
    signals: Iterable[signal.Signals], error: Callable[[int], BaseException]
) -> Iterator[None]:
    """Within: the first of ``signals`` raises ``error(signum)``, so the block unwinds through
    its ``finally`` blocks and stops what it started (servers in sessions of their own, which a
    signal to this process never reaches); later ones are ignored while it unwinds. The previous
    handlers come back after; a signal ignored when it starts stays ignored (``nohup``). Outside
    the main thread it changes nothing."""
    raised: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        del frame
        if not raised:
            raised.append(signum)
            raise error(signum)

    try:
        # A signal ignored on purpose (SIGHUP under nohup) stays ignored.
        chosen = [sig for sig in signals if signal.getsignal(sig) is not signal.SIG_IGN]
        previous = {sig: signal.signal(sig, handle) for sig in chosen}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
