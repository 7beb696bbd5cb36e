"""The network nemesis: a plan's toxics put on and taken off at their times, then healed.

:class:`NetworkNemesis` is a :class:`~pidfence.testing.script.FaultScript`, so it runs in the
same :func:`~pidfence.testing.script.drive` loop as the process faults. It is done once the last
toxic is off (``healed_at`` is then the clock reading); :meth:`NetworkNemesis.heal` removes
whatever is still on (call it in ``finally``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pidfence.testing.network import LinkFaults, describe_toxics
from pidfence.testing.plan import FaultPlan
from pidfence.testing.script import FaultScript


@dataclass(eq=False)
class NetworkNemesis(FaultScript):
    """Runs the network steps of ``plan`` on ``links``, timed from the first :meth:`poll`.

    Args:
        plan: the fault plan (its other steps are left to other scripts).
        links: the proxies of this run.
        clock: monotonic seconds.
    """

    name = "net"

    plan: FaultPlan
    links: LinkFaults
    started: float | None = field(default=None, init=False)
    #: Clock reading when the last toxic came off (None while any is on or to come).
    healed_at: float | None = field(default=None, init=False)
    #: How many of the plan's faults were put on a link (a fault on a link without a proxy is not).
    applied: int = field(default=0, init=False)
    _on: set[int] = field(default_factory=set, init=False)
    _off: set[int] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.steps = list(enumerate(self.plan.network_steps))
        for index, fault in self.steps:
            if not self.links.covers(fault):
                self._off.add(index)
                self.note(f"skipped (no proxy on {fault.target}): {fault.describe()}")

    def poll(self) -> None:
        if self.done:
            return
        now = self.clock()
        if self.started is None:
            self.started = now
            self.note(f"seed {self.plan.seed}: {len(self.steps)} network faults")
        elapsed = now - self.started
        for index, fault in self.steps:
            if index in self._off:
                continue
            if index not in self._on and elapsed >= fault.at_s:
                self.links.apply(index, fault)
                self._on.add(index)
                self.applied += 1
                self.happened = True
                self.note(
                    f"t={elapsed:.1f}s on  {fault.target}: {fault.kind} for "
                    f"{fault.duration_s:.1f}s ({describe_toxics(fault)})"
                )
            elif index in self._on and elapsed >= fault.ends_s:
                self.links.clear(index)
                self._on.discard(index)
                self._off.add(index)
                self.note(f"t={elapsed:.1f}s off {fault.target}: {fault.kind}")
        if len(self._off) == len(self.steps):
            self.healed_at = now
            self.note(f"t={elapsed:.1f}s healed: every link is clean")
            self.done = True

    def heal(self) -> None:
        """Remove every toxic still on (idempotent)."""
        self.links.heal()
        self._on.clear()
