"""The generation compare-and-set rule, shared by every coordinator."""

from __future__ import annotations

from pidfence.pid_allocator.errors import LeaseCapacityExhausted, StaleGeneration, UnknownPid
from pidfence.pid_allocator.generations import GENERATION_LIMIT


def next_generation(
    pid: int,
    requested: int,
    current: int,
    expire_ms: int,
    now_ms: int,
) -> int:
    """The generation a bump from ``requested`` moves to, given the stored ``current``.

    Raises:
        UnknownPid: the lease ended.
        StaleGeneration: ``requested`` is not the latest generation.
        LeaseCapacityExhausted: the generation space of this pid is used up.
    """
    if expire_ms <= now_ms:
        raise UnknownPid(f"pid {pid} expired at {expire_ms}; lease a new pid")
    if requested != current:
        raise StaleGeneration(
            f"pid {pid} is at generation {current}, not {requested}: another producer took it "
            "over (this one is fenced); stop writing with this pid"
        )
    if current + 1 >= GENERATION_LIMIT:
        raise LeaseCapacityExhausted(f"pid {pid} used every generation; lease a new pid")
    return current + 1
