"""``ZkCoordinator`` on an in-memory fake kazoo client: compare-and-set conflicts and ambiguous
writes (connection lost after the write was applied, or before) are settled by re-reading."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError

from pidfence.pid_allocator import NotOwner, StaleGeneration, ZkCoordinator
from pidfence.pid_allocator.capability import make_secret
from pidfence.pid_allocator.coordinator import BlockRequest
from pidfence.pid_allocator.generations import initial_generation
from pidfence.pid_allocator.lineage import Change, Lineage, Outcome


@dataclass
class Stat:
    version: int


class Done:
    """A kazoo async result that is already settled."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def get(self, timeout: float | None = None) -> Any:
        del timeout
        if self.error is not None:
            raise self.error
        return self.value


class FakeKazoo:
    """Enough of ``KazooClient`` for ``ZkCoordinator``; faults are queued per write."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.listeners: list[Any] = []
        # Per upcoming write: "lost-after" (applied, then ConnectionLoss), "lost-before"
        # (not applied, ConnectionLoss), or "race" (another writer bumps the version first).
        self.faults: list[str] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def start(self, timeout: float) -> None:
        del timeout

    def stop(self) -> None: ...

    def close(self) -> None: ...

    def ensure_path(self, path: str) -> None:
        self.nodes.setdefault(path, (b"", 0))

    def create(self, path: str, value: bytes) -> None:
        if path in self.nodes:
            raise NodeExistsError
        self.nodes[path] = (value, 0)

    def get_async(self, path: str) -> Done:
        if path not in self.nodes:
            return Done(error=NoNodeError())
        data, version = self.nodes[path]
        return Done((data, Stat(version)))

    def get_children_async(self, path: str) -> Done:
        prefix = path + "/"
        return Done([p[len(prefix) :] for p in self.nodes if p.startswith(prefix)])

    def _write(self, apply: Any) -> Done:
        fault = self.faults.pop(0) if self.faults else ""
        if fault == "lost-before":
            return Done(error=ConnectionLoss())
        result = apply()
        if fault == "lost-after":
            return Done(error=ConnectionLoss())
        return Done(result)

    def _set(self, path: str, value: bytes, version: int) -> Stat:
        if path not in self.nodes:
            raise NoNodeError
        if self.nodes[path][1] != version:
            raise BadVersionError
        self.nodes[path] = (value, version + 1)
        return Stat(version + 1)

    def set_async(self, path: str, value: bytes, version: int) -> Done:
        def apply() -> Stat:
            return self._set(path, value, version)

        try:
            return self._write(apply)
        except (BadVersionError, NoNodeError) as exc:
            return Done(error=exc)

    def create_async(self, path: str, value: bytes) -> Done:
        def apply() -> str:
            self.create(path, value)
            return path

        try:
            return self._write(apply)
        except NodeExistsError as exc:
            return Done(error=exc)

    def transaction(self) -> FakeTxn:
        return FakeTxn(self)


class FakeTxn:
    def __init__(self, zk: FakeKazoo) -> None:
        self.zk = zk
        self.ops: list[tuple[str, str, bytes, int]] = []

    def set_data(self, path: str, value: bytes, version: int) -> None:
        self.ops.append(("set", path, value, version))

    def create(self, path: str, value: bytes) -> None:
        self.ops.append(("create", path, value, -1))

    def commit_async(self) -> Done:
        zk = self.zk
        if zk.faults and zk.faults[0] == "race":
            zk.faults.pop(0)
            data, version = zk.nodes["/pidfence/pid_block"]
            zk.nodes["/pidfence/pid_block"] = (data, version + 1)  # someone else's claim

        def apply() -> list[Any]:
            snapshot = dict(zk.nodes)
            results: list[Any] = []
            for kind, path, value, version in self.ops:
                try:
                    if kind == "set":
                        results.append(zk._set(path, value, version))
                    else:
                        zk.create(path, value)
                        results.append(path)
                except (BadVersionError, NodeExistsError, NoNodeError) as exc:
                    zk.nodes = snapshot  # all or nothing, like a ZooKeeper multi
                    return [exc]
            return results

        return zk._write(apply)


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
