"""Owners racing one pid from the same read, in every interleaving hypothesis picks.

A stateful property test of the lineage rules (DESIGN.md §5 amended, round 4): each round, two
to four owners of the pid at the head of a lineage send a bump or a roll from the generation
they all read, through one of two servers, some as a retry of another's token, some judged at an
earlier time (a server that was paused, or whose clock lags), sometimes beside a garbage
collection, and sometimes with the next write ambiguous (landed or not, reply lost). Every store
call is one step and hypothesis chooses which operation takes the next one (``lease_kit.Turns``),
so an operation can be paused between its read and its write while the others run. The store is
the in-memory coordinator, or two ``ZkCoordinator`` (each with its own block cache) on one fake
ZooKeeper, stepped at each ZooKeeper call.

After every round the oracle checks: at most one owner won (a retry of the winner's token gets
the same answer); nothing was granted twice; the record in the store is the winner's, or did not
move; generations never move back; a pid has at most one successor; a pid is never granted
anything once its block and its record were collected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from pidfence.pid_allocator import MemoryCoordinator, ZkCoordinator, errors
from pidfence.pid_allocator.capability import make_secret
from pidfence.pid_allocator.coordinator import Block, BlockRequest
from pidfence.pid_allocator.generations import initial_generation
from pidfence.pid_allocator.lineage import Change, Lineage, Outcome
from tests.unit.lease_kit import FakeKazoo, Stepped, Turns

LIFETIME_MS, RETENTION_MS, BLOCK_TTL_MS = 1000, 1000, 1000
EXAMPLES = 60
MEMORY_CALLS = frozenset({"read_lineage", "write_lineage", "write_roll", "collect_garbage"})
ZOOKEEPER_CALLS = frozenset(
    {"get_async", "set_async", "create_async", "delete_async", "get_children_async"}
)
#: What a losing owner may be told.
REFUSALS = (errors.StaleGeneration, errors.NotOwner, errors.UnknownPid)


@dataclass
class Head:
    """The pid every owner of a round holds, and the generation they all read."""

    pid: int
    generation: int
    secret: bytes
    block: Block


@dataclass
class World:
    """The store, two servers' lineage rules on it, a clock and what the oracle remembers."""

    kind: str
    turns: Turns = field(default_factory=Turns)
    now: int = 10_000
    granted: set[tuple[int, int]] = field(default_factory=set)
    successors: dict[int, int] = field(default_factory=dict)
    collected: set[int] = field(default_factory=set)  # block starts the collector deleted
    rounds: int = 0
    next_pid: int = 0

    def __post_init__(self) -> None:
        if self.kind == "memory":
            self.store: Any = MemoryCoordinator()
            stepped = Stepped(self.store, self.turns, MEMORY_CALLS)
            self.servers = [Lineage(stepped, RETENTION_MS) for _ in range(2)]
            self.janitor: Any = stepped
        else:
            fake = Stepped(FakeKazoo(), self.turns, ZOOKEEPER_CALLS)
            zks = [ZkCoordinator("fake:2181", client=fake).start() for _ in range(3)]
            self.store, self.janitor = zks[2], zks[2]
            self.servers = [Lineage(zk, RETENTION_MS) for zk in zks[:2]]
        self.block: Block | None = None
        self.head = self.fresh_head()

    def fresh_head(self) -> Head:
        """A pid just issued, the head of a new lineage."""
        pid = self.take_pid()
        assert self.block is not None
        return Head(pid, initial_generation(self.block.salt, pid), self.secret(pid), self.block)

    def take_pid(self) -> int:
        """The next pid to issue, from a block claimed now once the last one is used up or past
        its issue window, as a server's supply gives them."""
        block = self.block
        if block is None or self.next_pid >= block.end or self.now >= block.claimed_ms + 500:
            request = BlockRequest(
                40, "a", f"claim-{self.now}", self.now, LIFETIME_MS, BLOCK_TTL_MS, b"s" * 16
            )
            block = self.block = self.store.claim_block(request)
            self.next_pid = block.start
        pid = self.next_pid
        self.next_pid += 1
        return pid

    def block_exists(self, start: int) -> bool:
        """Whether the store still holds the block record (not a server's cached copy)."""
        if self.kind == "memory":
            return self.store.block_at(start) is not None
        return f"/pidfence/blocks/{start:019d}" in self.store._zk._target.nodes

    def secret(self, pid: int) -> bytes:
        assert self.block is not None
        return make_secret(self.block.start, self.block.salt, pid, self.now - self.block.claimed_ms)

    def successor(self) -> Outcome:
        """A fresh pid for a roll, issued now, as a server's supply gives it."""
        assert self.block is not None
        pid = self.take_pid()
        gen = initial_generation(self.block.salt, pid)
        return Outcome(pid, gen, self.now + LIFETIME_MS, self.block, self.secret(pid))


@st.composite
def rounds(draw: st.DrawFn) -> dict[str, Any]:
    """One round: who sends what, how late, and what else happens."""
    owners = draw(st.integers(2, 4))
    return {
        "ops": [draw(st.sampled_from(["bump", "roll"])) for _ in range(owners)],
        "server": [draw(st.integers(0, 1)) for _ in range(owners)],
        "retry_of_first": [False] + [draw(st.booleans()) for _ in range(owners - 1)],
        "late_ms": [draw(st.sampled_from([0, 0, 0, 600, 2500])) for _ in range(owners)],
        "advance_ms": draw(st.sampled_from([0, 0, 400, 1500, 4000])),
        "collect": draw(st.booleans()),
        "fault": draw(st.sampled_from(["", "", "", "lost-after", "lost-before"])),
    }


def request(lineage: Lineage, op: str, change: Change, successor: Outcome) -> Any:
    """One owner's bump or roll, as its server runs it: (op, outcome)."""
    if op == "bump":
        return lambda: ("bump", lineage.bump(change))
    return lambda: ("roll", lineage.roll(change, successor))


def set_fault(world: World, fault: str) -> None:
    """The next write (of any server) is ambiguous: ``lost-after`` it landed, ``lost-before``
    it did not; ``""`` clears it."""
    if world.kind == "memory":
        world.store.lose_after_write(int(fault == "lost-after"))
        world.store.lose_before_write(int(fault == "lost-before"))
    else:
        world.store._zk._target.faults[:] = [fault] if fault else []


def play(world: World, plan: dict[str, Any], choose: Any) -> None:
    """One round, then the oracle."""
    world.now += plan["advance_ms"]
    world.rounds += 1
    head = world.head
    before = world.store.read_lineage(head.pid)
    operations: dict[str, Any] = {}
    tokens: dict[str, str] = {}
    for i, drawn in enumerate(plan["ops"]):
        retry = plan["retry_of_first"][i]  # a retry repeats the first owner's request
        op, token = (plan["ops"][0], tokens["o0"]) if retry else (drawn, f"t{world.rounds}-{i}")
        tokens[f"o{i}"] = token
        late = world.now - plan["late_ms"][i]
        change = Change(head.pid, head.generation, head.secret, token, late)
        lineage = world.servers[plan["server"][i]]
        operations[f"o{i}"] = request(lineage, op, change, world.successor())
    if plan["collect"]:
        operations["gc"] = lambda: ("gc", world.janitor.collect_garbage(world.now, RETENTION_MS))
    set_fault(world, plan["fault"])
    results = world.turns.run(operations, choose)
    set_fault(world, "")
    judge(world, head, before, tokens, results)


def judge(
    world: World,
    head: Head,
    before: Any,
    tokens: dict[str, str],
    results: dict[str, Any],
) -> None:
    trace = "\n".join(world.turns.trace[-40:])
    winners: dict[str, tuple[str, Outcome]] = {}
    for name, result in results.items():
        if name == "gc":  # an ambiguous delete makes a collection give up until the next
            assert not isinstance(result, AssertionError), (result, trace)
            continue
        if isinstance(result, BaseException):
            assert isinstance(result, (*REFUSALS, errors.LeaseServiceUnavailable)), (result, trace)
            continue
        op, outcome = result
        token = tokens[name]
        if token in winners:  # a retry of the winner: the same answer
            assert winners[token][1] == outcome, (winners[token], outcome, trace)
        winners[token] = (op, outcome)
    assert len(winners) <= 1, f"two owners won one round: {winners}\n{trace}"
    found = world.store.read_lineage(head.pid)
    # Only a collection past the block's retention deletes a record (the block's first).
    collected = "gc" in results and not world.block_exists(head.block.start)
    assert found is not None or before is None or collected, f"a record vanished\n{trace}"
    if not winners:
        assert found in (None, before), ("moved with no winner", before, found, trace)
        return
    ((token, (op, outcome)),) = winners.items()
    # Once its block and record are gone nothing about a pid is written (a write decided late
    # may still land on a record the collector has not reached: by compare-and-set).
    assert before is not None or head.block.start not in world.collected, trace
    identity = (outcome.pid, outcome.generation)
    assert identity not in world.granted, f"{identity} granted twice\n{trace}"
    world.granted.add(identity)
    if op == "roll":
        assert head.pid not in world.successors, f"pid {head.pid} rolled twice\n{trace}"
        world.successors[head.pid] = outcome.pid
        world.head = Head(outcome.pid, outcome.generation, outcome.secret, outcome.block)
    else:
        world.head = Head(head.pid, outcome.generation, head.secret, head.block)
    if found is None:
        assert collected, f"a grant missing from the store\n{trace}"
        return
    record, _ = found
    assert record.token == token, (record, token, trace)
    if before is not None:
        assert record.generation >= before[0].generation, ("went back", before, record, trace)
    if op == "bump":
        assert (record.generation, record.successor) == (head.generation + 1, None), (record, trace)
    else:
        assert (record.successor, record.successor_generation) == identity, (record, trace)
        child = world.store.read_lineage(outcome.pid)
        assert child is not None and child[0].predecessor == head.pid, (child, trace)


def refresh(world: World) -> None:
    """Note collected blocks; once a round has asked about a collected head, a new lineage."""
    head = world.head
    if head.block.start in world.collected:
        world.head = world.fresh_head()
    elif not world.block_exists(head.block.start):
        world.collected.add(head.block.start)


def racing(examples: int, shrink: bool = True) -> Callable[[], None]:
    """The property test with ``examples`` examples (without shrinking: a mutant's run stops at
    its first failure)."""
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.generate)

    @settings(max_examples=examples, deadline=None, phases=phases, database=None)
    @given(data=st.data(), kind=st.sampled_from(["memory", "zookeeper"]))
    def owners_race(data: st.DataObject, kind: str) -> None:
        world = World(kind)

        def choose(waiting: list[str]) -> str:
            return data.draw(st.sampled_from(waiting), label="next")

        for _ in range(data.draw(st.integers(1, 8), label="rounds")):
            play(world, data.draw(rounds(), label="round"), choose)
            refresh(world)

    return owners_race


test_racing_owners_never_both_win = racing(EXAMPLES)
