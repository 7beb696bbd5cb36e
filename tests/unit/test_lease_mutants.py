"""The lineage tests have teeth: each lineage mutant of ``pidfence.testing.mutations`` fails them.

Every mutant breaks one rule of the lease authority (DESIGN.md §5 amended, round 4) in the real
code, put in place with ``monkeypatch`` for one test. The lineage tests it must fail are called
as they are (their fixtures built here); the interleaving property test runs without shrinking,
so a caught mutant costs about a second. The race test against real servers
(``tests/integration/test_lease_race.py``) fails with the compare-and-set mutants too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from pidfence.pid_allocator import LeaseError
from pidfence.testing.mutations import LINEAGE_MUTATIONS
from tests.unit import test_lease_gc, test_lease_lineage
from tests.unit.lease_kit import LeaseServers
from tests.unit.test_lease_interleavings import racing

Check = Callable[[ThreadPoolExecutor], None]


def _interleavings(executor: ThreadPoolExecutor) -> None:
    racing(300, shrink=False)()


def _gc_timeline(executor: ThreadPoolExecutor) -> None:
    for kind in ("memory", "zookeeper"):
        test_lease_gc.test_collected_lineage_is_never_granted_again(executor, kind)


def _non_owners(executor: ThreadPoolExecutor) -> None:
    test_lease_lineage.test_non_owners_learn_nothing(LeaseServers(executor).service())


def _expired(executor: ThreadPoolExecutor) -> None:
    test_lease_lineage.test_expired_pid_can_be_rolled_within_retention_only(LeaseServers(executor))


def _roll_retires(executor: ThreadPoolExecutor) -> None:
    test_lease_lineage.test_roll_retires_the_pid_and_issues_a_successor(LeaseServers(executor))


#: Each mutant, and the lineage tests that must fail with it (each one of them).
CAUGHT_BY: dict[str, tuple[Check, ...]] = {
    "lineage-fresh-version": (_interleavings,),
    "lineage-unversioned-set": (_interleavings,),
    "lineage-gc-before-refusal": (_gc_timeline,),
    "lineage-non-owner-accepted": (_non_owners,),
    "lineage-expired-bump": (_expired,),
    "lineage-roll-leaves-pid-live": (_roll_retires, _interleavings),
}

#: How a lineage test fails: an assertion, or a lease rule answering what the test did not
#: expect (anything else would be a broken mutant, not a caught bug).
FAILURES = (AssertionError, pytest.fail.Exception, LeaseError)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(2)
    yield executor
    executor.shutdown()


def test_every_lineage_mutant_has_its_tests() -> None:
    assert set(CAUGHT_BY) == set(LINEAGE_MUTATIONS)


@pytest.mark.parametrize("mutant", sorted(CAUGHT_BY))
def test_a_lineage_mutant_fails_the_lineage_tests(
    mutant: str, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    LINEAGE_MUTATIONS[mutant](monkeypatch.setattr)
    for check in CAUGHT_BY[mutant]:
        with pytest.raises(FAILURES):
            check(pool)
