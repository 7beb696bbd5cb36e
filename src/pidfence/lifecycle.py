"""What every started-and-stopped thing shares: ``with thing:`` starts it and always stops it.

Kept outside the layers (it imports nothing of pidfence) so that the lease server's thread and the
services' process groups use one definition.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
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
