"""The lease server's clock: epoch milliseconds that advance with the monotonic clock.

Anchored to the wall clock once, at start; after that a wall-clock step (NTP, a VM resume, an
operator) neither drops live leases nor extends dead ones. Expiry across servers still compares
epoch milliseconds, so server clocks must agree to within the margin producers renew early by.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wall_clock_ms() -> int:
    """Epoch milliseconds from the wall clock."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """Milliseconds of the monotonic clock."""
    return time.monotonic_ns() // 1_000_000


class SteadyClock:
    """``anchor wall time + monotonic time elapsed since the anchor``, in epoch ms.

    Args:
        wall: epoch-ms source read once (injected in tests).
        monotonic: monotonic-ms source (injected in tests).
    """

    def __init__(
        self,
        wall: Callable[[], int] = wall_clock_ms,
        monotonic: Callable[[], int] = monotonic_ms,
    ) -> None:
        self._monotonic = monotonic
        self._anchor_mono = monotonic()
        self._anchor_wall = wall()

    def __call__(self) -> int:
        """Now, in epoch milliseconds, immune to wall-clock steps since the anchor."""
        return self._anchor_wall + (self._monotonic() - self._anchor_mono)
