"""A bug seeded into the producer's real session fails simulated schedules.

The simulation runs the real :class:`~pidfence.producer.IdempotentProducer` (its session, driver,
sender, lease keeper and recovery scan) over a simulated Kafka client, lease server and clock; it
keeps no copy of what the producer decides. So breaking one decision of the real code must show
up as anomalies in the simulated schedules, and the same schedules must be clean with the real
code: that is what these tests check, one seeded bug at a time (pytest's ``monkeypatch`` puts
the broken method in place for one test only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pidfence.producer import ProducerSession, recovery
from pidfence.producer.headers import Fence, Header
from pidfence.producer.sender import Sender
from pidfence.producer.sequencer import Sequencer
from pidfence.sim import SimResult, run
from tests.sim.schedules import assert_clean
from tests.sim.test_simulation import BUSY

SEEDS = range(8)
#: Crashes with zombies: resumes (bump, FENCE walk, recovery scan) and rollovers.
CRASHY = {**BUSY, "events": 120, "crash_p": 0.1, "zombie_p": 1.0}
#: Lease servers unreachable now and then: rollovers retried inside the lease, processes whose
#: lease ends first exit with LeaseExpired and are resumed.
OUTAGES = {**BUSY, "events": 200, "crash_p": 0.02, "lease_down_p": 0.05}
KNOBS = {"crashy": CRASHY, "outages": OUTAGES}

_real_extras = ProducerSession.extras


def no_fences(session: ProducerSession, walk_from: int, counts: Any) -> list[Fence]:
    """The resume plans no FENCE record (DESIGN §6 says: every partition, before any data)."""
    return []


def never_sends_fences(sender: Sender, fences: Any, timeout_s: float) -> None:
    """The resume's FENCE records are planned but never written (the driver drops them)."""


def lease_never_ends(session: ProducerSession, now_ms: int) -> bool:
    """Records are stamped after the lease ended (DESIGN §9: never send under an ended lease)."""
    return False


def no_first_record_cert(
    session: ProducerSession, topic: str, partition: int, seq: int, flags: int, now_ms: int
) -> tuple[Header, ...]:
    """Data records never carry ``pfc``; FENCEs still do (DESIGN §3 amended)."""
    return _real_extras(session, topic, partition, seq, flags, now_ms) if flags else ()


def no_handover(current: Sequencer) -> dict[tuple[str, int], int]:
    """A rollover's successor skips nothing its predecessor's lineage got into Kafka."""
    return {}


# (the class, the method, the broken one, the knobs, the anomalies it must cause)
MUTANTS: dict[str, tuple[type, str, Callable[..., Any], str, set[str]]] = {
    "resume_without_fence": (ProducerSession, "fences", no_fences, "crashy", {"lost", "zombie"}),
    "fences_never_sent": (Sender, "send_fences", never_sends_fences, "crashy", {"lost", "zombie"}),
    "stamp_after_lease_end": (
        ProducerSession,
        "ended",
        lease_never_ends,
        "outages",
        {"lost", "event_lost"},
    ),
    "no_first_record_cert": (
        ProducerSession,
        "extras",
        no_first_record_cert,
        "crashy",
        {"lost", "event_lost"},
    ),
    "no_handover": (
        recovery,
        "handover",
        no_handover,
        "crashy",
        {"event_duplicate"},
    ),
}


@pytest.fixture(scope="module")
def unpatched() -> dict[str, list[SimResult]]:
    """The schedules with the real producer, once per set of knobs."""
    return {name: [run(seed, **knobs) for seed in SEEDS] for name, knobs in KNOBS.items()}


def test_the_real_producer_passes_every_schedule(unpatched: dict[str, list[SimResult]]) -> None:
    for results in unpatched.values():
        for result in results:
            assert_clean(result)


def test_outages_really_happen(unpatched: dict[str, list[SimResult]]) -> None:
    stats = [r.stats for r in unpatched["outages"]]
    # Servers went away, calls found none, rollovers were retried, and a lease ended first.
    for name in ("lease_outages", "lease_unanswered", "lease_expired_exits", "rollovers"):
        assert sum(s[name] for s in stats) > 0, (name, [s[name] for s in stats])


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_bug_in_the_session_fails_simulated_schedules(
    mutant: str, monkeypatch: pytest.MonkeyPatch, unpatched: dict[str, list[SimResult]]
) -> None:
    owner, method, broken, knobs, anomalies = MUTANTS[mutant]
    monkeypatch.setattr(owner, method, broken)
    results = [run(seed, **KNOBS[knobs]) for seed in SEEDS]
    caught = [r for r in results if not r.ok]
    assert len(caught) >= 2, [r.report.summary() for r in results]
    for result in caught:
        found = {name for name, finding in result.report.findings.items() if finding.count}
        assert found & anomalies, (mutant, result.describe())
    # The same schedules with the real code: clean (the failures are the seeded bug's).
    assert all(r.ok for r in unpatched[knobs])
