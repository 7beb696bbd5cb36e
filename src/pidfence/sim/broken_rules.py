"""The broken broker rules a simulation mutation names: the real rules patched for one schedule.

As :mod:`pidfence.testing.mutations` breaks the product, so the state, the batch path, every
replay and the producers' recovery scan see the bug; the oracle's strict rules judge afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from pidfence.broker_plugin import CODE_OF, holes
from pidfence.broker_plugin import batch as batch_path
from pidfence.broker_plugin.rules import RulesKernel
from pidfence.sim.knobs import Mutation
from pidfence.wire import FLAG_FENCE, Verdict

_APPENDED = CODE_OF[Verdict.APPENDED]
_DUPLICATE = CODE_OF[Verdict.DUPLICATE]


@contextmanager
def broken_rules(mutation: Mutation | None) -> Iterator[None]:
    """Patch the real broker rules (:class:`RulesKernel`'s ``decide``, the batch path's plan)
    with the bug a mutation names, for one schedule, so the state, the batch path and every
    replay see it (as :mod:`pidfence.testing.mutations` breaks the product); so does the
    producers' recovery scan, which decides with the same rules, as it would in a build with
    the bug. The oracle's strict rules run after the schedule, on the real rules:

    * ``accept_stale_generation``: a data record of an older generation than its pid's entry is
      judged as if it were of the entry's generation (zombies are not fenced).
    * ``accept_old_seq``: a record at or below its pid's highwater (not in a hole) is appended
      again, by the per-record rules and by the batch path's fast path (no dedup).
    * ``drop_fence``: a FENCE is answered ``FENCE`` but changes nothing (no entry, no generation).

    Any other mutation (or None) leaves the rules as they are.
    """
    if mutation not in ("accept_stale_generation", "accept_old_seq", "drop_fence"):
        yield
        return
    real_decide, real_plan = RulesKernel.decide, batch_path._plan

    def decide(self: RulesKernel, *args: Any) -> None:
        # RulesKernel.decide's arguments: pid, generation, seq, flags, ts, ref, out, token[, cert]
        pid, g, s, flags, ts, ref, out, token, *cert = args
        fence = flags & FLAG_FENCE
        entry = self.entries.get(pid) if pid else None
        if mutation == "drop_fence" and fence and pid:
            out.append((ref, Verdict.FENCE, token))
            return
        if entry is not None and not fence:
            if mutation == "accept_stale_generation" and g < entry.generation:
                g = entry.generation
            elif (
                mutation == "accept_old_seq"
                and g == entry.generation
                and s <= entry.highwater
                and holes.find(entry, s) < 0
            ):
                out.append((ref, Verdict.APPENDED, token))
                self.advance(ts, out)
                return
        real_decide(self, pid, g, s, flags, ts, ref, out, token, *cert)

    def plan(*args: Any) -> Any:
        fast_rows, fast_codes, *rest = real_plan(*args)
        codes = np.where(fast_codes == _DUPLICATE, _APPENDED, fast_codes).astype(np.uint8)
        return (fast_rows, codes, *rest)

    setattr(RulesKernel, "decide", decide)  # noqa: B010 - restored below
    if mutation == "accept_old_seq":
        setattr(batch_path, "_plan", plan)  # noqa: B010
    try:
        yield
    finally:
        setattr(RulesKernel, "decide", real_decide)  # noqa: B010
        setattr(batch_path, "_plan", real_plan)  # noqa: B010


__all__ = ["broken_rules"]
