"""What the simulation tests share: the space of schedules Hypothesis draws, and how one is judged.

Reproducibility: by default the schedules are derandomized (the same ones on every run), so a red
CI always means the change broke something, never that today's random draw found an old bug. Set
``PIDFENCE_SIM_EXPLORE=1`` to draw new schedules (and ``PIDFENCE_SIM_EXAMPLES=N`` for more).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Collection
from typing import Any

from hypothesis import HealthCheck, given, note, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from pidfence.sim import Knobs, SimResult, run
from pidfence.sim.runner import replay_hint

EXPLORE = os.environ.get("PIDFENCE_SIM_EXPLORE", "") not in ("", "0")
EXAMPLES = int(os.environ.get("PIDFENCE_SIM_EXAMPLES", "1000"))

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)
#: Two producers, 150 events over two partitions one apart, crashing, every crash leaving a
#: zombie: the world the focused tests add their faults to.
CRASHING_PAIR: dict[str, Any] = {
    "events": 150,
    "partitions": 2,
    "producers": 2,
    "reorder": 1,
    "crash_p": 0.1,
    "zombie_p": 1.0,
}
#: Every fault of the simulation, each knob with the values worth drawing.
SCHEDULE_SPACE: dict[str, st.SearchStrategy[Any]] = {
    "events": st.integers(1, 250),
    "partitions": st.integers(1, 4),
    "producers": st.integers(1, 3),
    "drop_p": st.sampled_from([0.0, 0.05, 0.2, 0.5, 0.8]),
    "dup_p": st.sampled_from([0.0, 0.05, 0.2, 0.5]),
    "reorder": st.integers(1, 6),
    "crash_p": st.sampled_from([0.0, 0.02, 0.1, 0.3]),
    "zombie_p": st.sampled_from([0.0, 0.5, 1.0]),
    "pause_p": st.sampled_from([0.0, 0.3, 1.0]),
    "down_p": st.sampled_from([0.0, 0.1, 0.5]),
    "double_p": st.sampled_from([0.0, 0.1, 0.5]),
    "restart_p": st.sampled_from([0.0, 0.1, 0.5]),
    "plain_p": st.sampled_from([0.0, 0.05]),
    "step_ms": st.integers(1, 20),
    # >= 96 steps of 20 ms; short lifetimes force rollovers and broker-side expiry.
    "lifetime_ms": st.sampled_from([1_920, 3_000, 10_000, 10**8]),
    "checkpoint_every": st.integers(1, 20),
    "batch_every": st.integers(1, 6),
    # The world of DESIGN §10 amended: timeout holes, late and mid-log starts, retention,
    # ended leases' records written again (fit() keeps each where its preconditions hold).
    "timeout_p": st.sampled_from([0.0, 0.0, 0.0, 0.01]),
    "sink_start": st.sampled_from([0, 0, 30, 100]),
    "sink_latest": st.booleans(),
    "trim_p": st.sampled_from([0.0, 0.0, 0.01, 0.05]),
    "resend_p": st.sampled_from([0.0, 0.0, 0.01]),
}


def fit(knobs: dict[str, Any]) -> dict[str, Any]:
    """Knobs where their preconditions hold (docs/gaps.md, "Where liveness gives way to
    safety"): adoption after a trim or a mid-log start needs in-order sessions
    (``reorder=1``)."""
    out = dict(knobs)
    if out.get("reorder", 3) != 1:
        out["trim_p"], out["sink_latest"] = 0.0, False
    return out


def knob_space(
    without: Collection[str] = (), **changes: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """:data:`SCHEDULE_SPACE` with the knobs ``without`` left at their defaults and ``changes``
    drawn instead (new knobs after the others)."""
    kept = {name: values for name, values in SCHEDULE_SPACE.items() if name not in without}
    return st.fixed_dictionaries({**kept, **changes}).map(fit)


def explored(max_examples: int) -> settings:
    """Hypothesis settings for drawing ``max_examples`` schedules (derandomized unless
    ``PIDFENCE_SIM_EXPLORE``); a failure prints its blob to reproduce it."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=not EXPLORE,
        database=None if not EXPLORE else settings.default.database,
        suppress_health_check=[HealthCheck.too_slow],
        print_blob=True,
    )


def judged(seed: int, **knobs: Any) -> SimResult:
    """Run one schedule, with its replay call noted first (so even an exception replays)."""
    note(f"seed {seed}; replay with:\n{replay_hint(seed, Knobs(**knobs))}")
    return run(seed, **knobs)


def assert_clean(result: SimResult) -> None:
    """Zero anomalies, every upstream event in the log exactly once (and every record without
    a producer the sink read), and no event decided otherwise than the strict rules on the full
    view of the log decide it (the oracle)."""
    examples = {n: f.examples[:3] for n, f in result.report.findings.items() if f.count}
    assert result.report.ok, f"{result.describe()}\nexamples: {examples}"
    assert result.exactly_once, result.describe()
    assert result.non_idempotent_once, result.describe()
    assert result.oracle.ok, result.describe()


def walk_shard(
    shard: int, shards: int, space: st.SearchStrategy[dict[str, Any]], examples: int, pinned: int
) -> int:
    """Judge every ``shards``-th schedule of one drawn sequence, from ``shard`` on.

    The sequence is drawn from ``pinned`` (so editing a test keeps its schedules) unless
    exploring (``PIDFENCE_SIM_EXPLORE``: fresh schedules each run). Returns how many schedules
    the sequence held.
    """
    drawn = itertools.count()

    @explored(examples)
    @given(seed=SEEDS, knobs=space)
    def schedule(seed: int, knobs: dict[str, Any]) -> None:
        if next(drawn) % shards == shard:
            assert_clean(judged(seed, **knobs))

    if not EXPLORE:
        schedule = hypothesis_seed(pinned)(schedule)
    schedule()
    return next(drawn)
