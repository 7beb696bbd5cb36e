"""The demo's progress lines: one bar per logical producer (and the copier) with its real count.

A bar counts distinct events (a record sent twice counts once), so it never passes its total;
what was sent on top is shown as such: ``5000/5000 + 450 resent``, ``+ 50 zombie``. Each
instance ends in a final state: ``done``, ``killed``, ``replaced``, ``fenced`` (or ``failed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pidfence.demo.procs import Worker


@dataclass(frozen=True)
class RoleLine:
    """What one bar shows.

    Attributes:
        distinct: distinct events acknowledged over every instance.
        resent: acknowledged records on top of ``distinct`` that are not zombie writes.
        zombie: records a fenced zombie got acknowledged after it woke up.
        states: ``(instance, state)`` in start order.
    """

    distinct: int
    resent: int
    zombie: int
    states: tuple[tuple[str, str], ...]

    @property
    def running(self) -> bool:
        """True while any instance runs."""
        return any(state == "running" for _, state in self.states)

    def note(self) -> str:
        """``+ 450 resent, + 50 zombie · p1 fenced → p1.r1 done``."""
        extras = []
        if self.resent:
            extras.append(f"+ {self.resent:,} resent")
        if self.zombie:
            extras.append(f"+ {self.zombie:,} zombie")
        if len(self.states) == 1:
            states = self.states[0][1]
        else:
            states = " → ".join(f"{name} {state}" for name, state in self.states)
        return " · ".join([", ".join(extras), states] if extras else [states])


def role_line(instances: Sequence[Worker], zombie_wrote: int = 0) -> RoleLine:
    """The bar of a logical producer made of ``instances`` (restarts, replacements)."""
    acked = sum(w.acked() for w in instances)
    distinct = len(set().union(*(w.events for w in instances))) if instances else 0
    extra = max(0, acked - distinct)
    zombie = min(zombie_wrote, extra)
    return RoleLine(
        distinct=distinct,
        resent=extra - zombie,
        zombie=zombie,
        states=tuple((w.name, w.final_state()) for w in instances),
    )
