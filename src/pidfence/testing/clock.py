"""A clock that moves only when a test moves it, for the ``clock=`` parameters of pidfence.

Every clock in pidfence is injected (lease services, fault scripts, the supervisor, the nemesis),
as kazoo's lease recipe takes ``utcnow=``; with this one, expiry and retry tests run in no time
and say exactly when each reading happens.
"""

from __future__ import annotations

from typing import Generic, TypeVar

#: Epoch milliseconds (an ``int``) or monotonic seconds (a ``float``).
Reading = TypeVar("Reading", int, float)


class ManualClock(Generic[Reading]):
    """Returns :attr:`now` when called; set or advance :attr:`now` to move time.

    Args:
        now: the first reading, e.g. ``ManualClock(1_000_000)`` for epoch ms or
            ``ManualClock(100.0)`` for monotonic seconds.
    """

    def __init__(self, now: Reading) -> None:
        self.now: Reading = now

    def __call__(self) -> Reading:
        return self.now
