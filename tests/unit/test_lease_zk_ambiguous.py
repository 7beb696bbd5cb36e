"""``ZkCoordinator`` on an in-memory fake kazoo client: compare-and-set conflicts and ambiguous
writes (connection lost after the write was applied, or before) are settled by re-reading."""

from __future__ import annotations

import pytest
from kazoo.exceptions import AuthFailedError, NoAuthError

from pidfence.pid_allocator import (
    LeaseServiceUnavailable,
    NotOwner,
    StaleGeneration,
    ZkCoordinator,
)
from pidfence.pid_allocator.capability import make_secret
from pidfence.pid_allocator.coordinator import BlockRequest
from pidfence.pid_allocator.generations import initial_generation
from pidfence.pid_allocator.lineage import Change, Lineage, Outcome
from tests.unit.lease_kit import FakeKazoo


def _request(token: str) -> BlockRequest:
    return BlockRequest(10, "server-a", token, 1000, 10_000, 500, b"s" * 16)


@pytest.fixture
def zk() -> tuple[ZkCoordinator, FakeKazoo]:
    fake = FakeKazoo()
    return ZkCoordinator("fake:2181", client=fake, op_timeout_s=0.1).start(), fake


def test_claims_are_consecutive(zk: tuple[ZkCoordinator, FakeKazoo]) -> None:
    coordinator, _ = zk
    first = coordinator.claim_block(_request("t1"))
    second = coordinator.claim_block(_request("t2"))
    assert (first.start, first.end, second.start, second.end) == (1, 11, 11, 21)
    assert coordinator.writes == 2


def test_ambiguous_claim_that_landed_is_used(zk: tuple[ZkCoordinator, FakeKazoo]) -> None:
    coordinator, fake = zk
    fake.faults = ["lost-after"]
    block = coordinator.claim_block(_request("mine"))
    assert (block.start, block.token) == (1, "mine")
    assert coordinator.claim_block(_request("next")).start == 11  # nothing claimed twice


def test_ambiguous_claim_that_did_not_land_is_retried(
    zk: tuple[ZkCoordinator, FakeKazoo],
) -> None:
    coordinator, fake = zk
    fake.faults = ["lost-before"]
    block = coordinator.claim_block(_request("mine"))
    assert block.start == 1
    assert coordinator.writes == 2  # the lost attempt and the retry


def test_claim_that_loses_the_race_reads_again(zk: tuple[ZkCoordinator, FakeKazoo]) -> None:
    coordinator, fake = zk
    fake.faults = ["race"]
    block = coordinator.claim_block(_request("mine"))
    assert block.start == 1  # the racing write bumped the version only; it claimed no pids
    assert coordinator.writes == 2


def test_block_at_reads_one_record_and_never_lists(zk: tuple[ZkCoordinator, FakeKazoo]) -> None:
    coordinator, fake = zk
    coordinator.claim_block(_request("a"))
    fake.get_children_async = None  # type: ignore[assignment,method-assign]  # listing forbidden
    other = ZkCoordinator("fake:2181", client=fake).start()  # a second server, cold cache
    found = other.block_at(1)
    assert found is not None
    assert (found.start, found.token) == (1, "a")
    assert other.block_at(11) is None
    assert other.block_at(5) is None


SALT = b"s" * 16


def _lineage(zk: tuple[ZkCoordinator, FakeKazoo]) -> Lineage:
    coordinator, _ = zk
    coordinator.claim_block(_request("a"))  # pids 1..10, salt SALT, claimed at 1000
    return Lineage(coordinator, retention_ms=10_000)


@pytest.mark.parametrize("fault", ["lost-after", "lost-before"])
def test_ambiguous_bump_is_settled_by_its_token(
    zk: tuple[ZkCoordinator, FakeKazoo], fault: str
) -> None:
    lineage, (_, fake) = _lineage(zk), zk
    secret, g0 = make_secret(1, SALT, 5, 0), initial_generation(SALT, 5)
    fake.faults = [fault]
    assert lineage.bump(Change(5, g0, secret, "tok", 1000)).generation == g0 + 1
    fake.faults = [fault]
    assert lineage.bump(Change(5, g0 + 1, secret, "tok2", 1000)).generation == g0 + 2
    with pytest.raises(StaleGeneration):
        lineage.bump(Change(5, g0 + 1, secret, "other", 1000))


@pytest.mark.parametrize("fault", ["lost-after", "lost-before"])
def test_ambiguous_roll_is_re_read_never_guessed(
    zk: tuple[ZkCoordinator, FakeKazoo], fault: str
) -> None:
    lineage, (coordinator, fake) = _lineage(zk), zk
    block = coordinator.block_at(1)
    assert block is not None
    secret, g0 = make_secret(1, SALT, 5, 0), initial_generation(SALT, 5)
    successor = Outcome(7, initial_generation(SALT, 7), 9000, block, make_secret(1, SALT, 7, 0))
    fake.faults = [fault]
    assert lineage.roll(Change(5, g0, secret, "roll-1", 1000), successor) == successor
    found = coordinator.read_lineage(5)
    assert found is not None
    assert (found[0].successor, found[0].generation) == (7, g0)
    child = coordinator.read_lineage(7)
    assert child is not None
    assert child[0].predecessor == 5
    # A second roll of the same generation (a zombie) is refused and told the successor.
    other = Outcome(8, initial_generation(SALT, 8), 9000, block, make_secret(1, SALT, 8, 0))
    with pytest.raises(StaleGeneration) as stale:
        lineage.roll(Change(5, g0, secret, "roll-2", 1000), other)
    assert stale.value.successor == 7
    assert coordinator.read_lineage(8) is None


def test_bumps_and_rolls_of_unknown_pids_never_list_a_directory(
    zk: tuple[ZkCoordinator, FakeKazoo],
) -> None:
    """Finding 7: a bump of a never-issued pid listed every child of ``blocks``."""
    lineage, (coordinator, fake) = _lineage(zk), zk
    fake.get_children_async = None  # type: ignore[assignment,method-assign]  # listing forbidden
    block = coordinator.block_at(1)
    assert block is not None
    for pid, secret in [(10**12, b""), (10**12, make_secret(1, SALT, 5, 0)), (5, b"\x00" * 28)]:
        with pytest.raises(NotOwner):
            lineage.bump(Change(pid, 0, secret, "t", 1000))
        with pytest.raises(NotOwner):
            lineage.roll(Change(pid, 0, secret, "t", 1000), Outcome(7, 0, 9000, block, b""))


@pytest.mark.parametrize("error", [NoAuthError, AuthFailedError])
def test_an_auth_failure_at_start_names_the_auth_file(error: type[Exception]) -> None:
    """Wrong or missing ``--zk-auth-file``: it was reported as "cannot reach ZooKeeper"."""

    class Refusing(FakeKazoo):
        def ensure_path(self, path: str) -> None:
            raise error()

    with pytest.raises(LeaseServiceUnavailable, match="--zk-auth-file") as refused:
        ZkCoordinator("fake:2181", client=Refusing()).start()
    assert error.__name__ in str(refused.value) and "cannot reach" not in str(refused.value)
