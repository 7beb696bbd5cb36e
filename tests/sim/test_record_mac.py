"""The per-record mode (``--record-mac-secret``) in the simulation: the attacker also injects data
records at a live pid's next seq inside its generation (no certificate needed there), and only the
record MAC stops them; producers crash, resume and scan what their predecessors wrote.

Without the mode such an injection is appended and the producer's own record at that seq becomes
a ``DUPLICATE``: the event is lost (docs/security.md, "Per-record integrity").
"""

from __future__ import annotations

from typing import Any

import pytest

from pidfence.producer import recovery
from pidfence.sim import SimResult, run
from pidfence.sim.attacker import INJECTIONS
from tests.sim.schedules import assert_clean
from tests.sim.test_attacker import assert_refused

# Aggressive on purpose: an attack every few steps, crashes with long downtimes (resumes roll
# and follow), paused zombies, short leases.
MAC_MODE: dict[str, Any] = {
    "events": 80,
    "partitions": 2,
    "producers": 2,
    "attack_p": 0.3,
    "record_mac": True,
    "crash_p": 0.1,
    "down_p": 0.5,
    "zombie_p": 0.7,
    "pause_p": 0.5,
    "lifetime_ms": 1920,
    "step_ms": 14,
    "checkpoint_every": 5,
}
SEEDS = range(24)


def knobs(seed: int) -> dict[str, Any]:
    """In-order sessions (the sink resolves gaps) for two of three seeds, a reordering client
    otherwise; LogAppendTime (back-dating drawn too) for odd seeds."""
    return MAC_MODE | {"reorder": 1 if seed % 3 else 3, "log_append_time": seed % 2 == 1}


@pytest.fixture(scope="module")
def schedules() -> list[SimResult]:
    """The per-record mode's schedules, run once for the checks below."""
    return [run(seed, **knobs(seed)) for seed in SEEDS]


def test_every_forgery_is_forged_and_every_event_lands_once(schedules: list[SimResult]) -> None:
    for result in schedules:
        assert_refused(result)
        assert_clean(result)


def test_every_injection_happens_and_only_the_mac_refuses_it(schedules: list[SimResult]) -> None:
    for kind in INJECTIONS:
        assert sum(r.stats.get(f"attack_{kind}", 0) for r in schedules) > 0, kind
    for result in schedules:
        # Every forgery, the injections included, fails its MAC before the rules see it, and
        # no genuine record does.
        assert result.stats["forged_reason_mac"] == result.stats["forged_sent"], result.describe()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_recovery_scan_that_does_not_check_macs_is_caught(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The mutation, seeded in the real session: the resume's scan gets no MAC keys, so it takes
    # an injected record at its pid's next seq for one of its predecessor's, and the successor
    # pid skips an event that never reached the log (or the checker sees a record the ledger
    # never acknowledged). The sink still refuses every forgery.
    monkeypatch.setattr(recovery, "scan_keys", lambda *args: {})
    result = run(seed, **knobs(seed))
    assert_refused(result)
    assert not result.ok, result.describe()
