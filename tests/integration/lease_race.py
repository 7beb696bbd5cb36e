"""The lease race: owners of the same pids racing bumps and rolls through two lease servers.

Each lineage (a pid, then its successors) has four owners holding its secret, two on each server.
A round: all four send a bump or a roll of the head pid from the generation they all hold (the
one the last round ended at, which the oracle read from ZooKeeper), at the same instant, each
with a fresh token. An owner that gets ``UNAVAILABLE``, ``RATE_LIMITED``, no answer or a broken
connection sends the same request again, with the same token, to the other server, until it gets
a grant or a refusal. So every round is a compare-and-set race on the head's record in ZooKeeper
(each pid is bumped once before the race, so every round is a versioned set, never a create), and
owners go on after losing one.

The oracle, after each round, reads the record from ZooKeeper directly: at most one owner won (a
retry of the winner's token gets the same answer), the record is the winner's (its token, the
generation or successor granted), it moved only if someone won, its generation never went back,
and no (pid, generation) was granted twice in the whole run; at the end every grant is checked in
ZooKeeper once more. Every request and answer is logged (``Race.log``).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pidfence.pid_allocator import LeaseClient, LineageRecord, ZkCoordinator
from pidfence.pid_allocator.errors import LeaseError
from tests.fixtures.lease_clients import RawLease

#: Answers that end an owner's round.
REFUSED = {"STALE_GENERATION", "NOT_OWNER", "UNKNOWN_PID"}
#: Answers after which the owner sends the same request again (same token).
RETRIED = {"UNAVAILABLE", "RATE_LIMITED"}
OWNERS = 4


@dataclass
class Head:
    """The pid a lineage's owners hold, the generation they hold it at, and its secret."""

    pid: int
    generation: int
    secret: bytes


@dataclass
class Answer:
    """What one owner got in one round."""

    owner: int
    op: str
    token: str
    reply: dict[str, Any] | None = None  # the final reply (None: no answer before the deadline)
    retries: int = 0  # sends of the same request after a retriable answer or a lost one
    unavailable: int = 0  # of which answered UNAVAILABLE

    @property
    def granted(self) -> bool:
        return self.reply is not None and self.reply.get("error") is None

    @property
    def identity(self) -> tuple[int, int]:
        assert self.reply is not None
        return int(self.reply["pid"]), int(self.reply["generation"])


class Owner:
    """One owner: each round starts on its own server (owners alternate between the two) and
    fails over to the other for a retry."""

    def __init__(self, number: int, servers: list[str], timeout_s: float) -> None:
        self.number = number
        self.home = servers[number % 2 :] + servers[: number % 2]
        self.timeout_s = timeout_s
        self.conn: RawLease | None = None
        self.server = ""

    def _exchange(self, server: str, op: str, fields: dict[str, Any]) -> dict[str, Any] | None:
        try:
            if self.conn is None or self.server != server:
                self.close()
                self.conn, self.server = RawLease(server, timeout=self.timeout_s), server
            self.conn.send(op, **fields)
            reply = self.conn.recv()
        except OSError:
            reply = None
        if reply is None:
            self.close()
        return reply

    def send(self, answer: Answer, fields: dict[str, Any], deadline: float) -> None:
        """Send until a grant or a refusal (or the deadline), the same token every time."""
        attempt = 0
        while time.monotonic() < deadline:
            server = self.home[attempt % 2]  # fail over, as LeaseClient does
            reply = self._exchange(server, answer.op, {**fields, "token": answer.token})
            if reply is not None and reply.get("error") not in RETRIED:
                answer.reply = reply
                return
            answer.unavailable += reply is not None and reply.get("error") == "UNAVAILABLE"
            answer.retries += 1
            attempt += 1
            time.sleep(0.05)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@dataclass
class Race:
    """Owners racing ``lineages`` pids through ``servers``; ZooKeeper read through ``zk_hosts``
    (with the servers' chroot) by the oracle.

    Attributes:
        anomalies: what the oracle found (empty: the lease authority held).
        stats: rounds, grants, refusals by code, retries, rounds recovered by a retry.
        log: every round's answers, as JSON lines (written by :meth:`save`).
    """

    servers: list[str]
    zk_hosts: str
    lineages: int = 3
    round_deadline_s: float = 45.0
    seed: int = field(default_factory=lambda: random.SystemRandom().randrange(1 << 30))
    anomalies: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    log: list[dict[str, Any]] = field(default_factory=list)
    granted: dict[tuple[int, int], str] = field(default_factory=dict)
    heads: dict[int, Head] = field(default_factory=dict)  # each lineage's head after its last round
    bumps: list[tuple[int, int]] = field(default_factory=list)  # (pid, generation) granted
    rolls: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, successor, its gen)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self.reader = ZkCoordinator(self.zk_hosts, op_timeout_s=2.0).start()

    # -- running ---------------------------------------------------------------------------------

    def run(self, until: Callable[[], bool]) -> None:
        """Race every lineage until ``until()`` is true (checked between rounds)."""
        heads = [self._first_head() for _ in range(self.lineages)]
        with ThreadPoolExecutor(self.lineages) as pool:
            for done in [pool.submit(self._lineage, i, h, until) for i, h in enumerate(heads)]:
                done.result()

    def _first_head(self) -> Head:
        with LeaseClient(self.servers, retries=20, backoff_s=0.1) as client:
            lease = client.lease()
            bumped = client.bump(lease.pid, lease.generation, lease.secret)  # a record exists
        with self._lock:
            self.granted[(bumped.pid, bumped.generation)] = "setup"
            self.bumps.append((bumped.pid, bumped.generation))
        return Head(bumped.pid, bumped.generation, lease.secret)

    def _lineage(self, index: int, head: Head, until: Callable[[], bool]) -> None:
        rng = random.Random(self.seed + index)  # a replayable race
        owners = [Owner(i, self.servers, timeout_s=3.0) for i in range(OWNERS)]
        before = self._read(head.pid)
        try:
            with ThreadPoolExecutor(OWNERS) as pool:
                while not until():
                    head, before = self._round(index, head, before, owners, pool, rng)
        finally:
            self.heads[index] = head
            for owner in owners:
                owner.close()

    def _round(
        self,
        lineage: int,
        head: Head,
        before: tuple[LineageRecord, int] | None,
        owners: list[Owner],
        pool: ThreadPoolExecutor,
        rng: random.Random,
    ) -> tuple[Head, tuple[LineageRecord, int] | None]:
        fields = {"pid": head.pid, "generation": head.generation, "secret": head.secret}
        answers = [
            Answer(owner.number, rng.choice(("bump", "roll")), uuid.uuid4().hex) for owner in owners
        ]
        start = threading.Barrier(OWNERS)
        deadline = time.monotonic() + self.round_deadline_s

        def race(owner: Owner, answer: Answer) -> None:
            start.wait()
            owner.send(answer, fields, deadline)

        for done in [pool.submit(race, o, a) for o, a in zip(owners, answers, strict=True)]:
            done.result()
        after = self._read(head.pid)
        following = self._judge(lineage, head, before, after, answers)
        return following, (after if following.pid == head.pid else self._read(following.pid))

    def _read(self, pid: int) -> tuple[LineageRecord, int] | None:
        """The record of ``pid`` in ZooKeeper (waiting while ZooKeeper is down)."""
        deadline = time.monotonic() + 120
        while True:
            try:
                return self.reader.read_lineage(pid)
            except LeaseError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # -- the oracle ------------------------------------------------------------------------------

    def _anomaly(self, text: str) -> None:
        with self._lock:
            self.anomalies.append(text)

    def _judge(
        self,
        lineage: int,
        head: Head,
        before: tuple[LineageRecord, int] | None,
        after: tuple[LineageRecord, int] | None,
        answers: list[Answer],
    ) -> Head:
        where = f"lineage {lineage}: pid {head.pid} at generation {head.generation}"
        self._note(lineage, head, answers, after)
        winners: dict[str, Answer] = {}
        for answer in answers:
            if answer.reply is None:
                self._anomaly(f"{where}: owner {answer.owner} got no answer")
            elif answer.granted:
                if answer.token in winners and winners[answer.token].identity != answer.identity:
                    self._anomaly(f"{where}: one token, two answers")
                winners[answer.token] = answer
        if before is None or after is None:
            self._anomaly(f"{where}: no record before ({before}) or after ({after}) the round")
            return head
        record = after[0]
        if record.generation < before[0].generation:
            self._anomaly(f"{where}: generation went back to {record.generation}")
        if len(winners) > 1:
            found = sorted((a.op, a.identity) for a in winners.values())
            self._anomaly(f"{where}: {len(winners)} owners won one round: {found}")
        for answer in winners.values():
            with self._lock:
                if answer.identity in self.granted:
                    self._anomaly(f"{where}: {answer.identity} granted twice")
                self.granted[answer.identity] = answer.token
        if not winners:
            if after != before:
                self._anomaly(f"{where}: record moved with no grant: {before} -> {after}")
            return head
        won = next(iter(winners.values()))
        self.stats["won by a retry"] += won.retries > 0
        self.stats["won after UNAVAILABLE"] += won.unavailable > 0
        if record.token != won.token:
            self._anomaly(f"{where}: the {won.op} granted {won.identity} is not in ZooKeeper")
            return head
        assert won.reply is not None
        if won.op == "bump":
            if (record.generation, record.successor) != (head.generation + 1, None):
                self._anomaly(f"{where}: bump granted {won.identity}, ZooKeeper has {record}")
            with self._lock:
                self.bumps.append(won.identity)
            return Head(head.pid, won.identity[1], head.secret)
        if (record.successor, record.successor_generation) != won.identity:
            self._anomaly(f"{where}: roll granted {won.identity}, ZooKeeper has {record}")
        with self._lock:
            self.rolls.append((head.pid, *won.identity))
        return Head(*won.identity, bytes(won.reply["secret"]))

    def _note(
        self,
        lineage: int,
        head: Head,
        answers: list[Answer],
        after: tuple[LineageRecord, int] | None,
    ) -> None:
        with self._lock:
            self.stats["rounds"] += 1
            for answer in answers:
                code = None if answer.reply is None else answer.reply.get("error")
                self.stats[f"{answer.op} {code or 'granted'}"] += 1
                self.stats["retries"] += answer.retries
            self.log.append(
                {
                    "lineage": lineage,
                    "pid": head.pid,
                    "generation": head.generation,
                    "answers": [
                        {
                            "owner": a.owner,
                            "op": a.op,
                            "token": a.token,
                            "retries": a.retries,
                            "reply": None
                            if a.reply is None
                            else {k: v for k, v in a.reply.items() if k != "secret"},
                        }
                        for a in answers
                    ],
                    "zookeeper": None if after is None else repr(after[0]),
                }
            )

    def replay_landed(self, op: str) -> None:
        """Each lineage's head moved by ``op`` through the first server, then the same request
        (same token) sent again through the second, as an owner whose reply was lost retries:
        the retry must be answered with the same grant, not refused as stale."""
        first, again = Owner(0, self.servers, timeout_s=10.0), Owner(1, self.servers, 10.0)
        try:
            for index, head in sorted(self.heads.items()):
                fields = {"pid": head.pid, "generation": head.generation, "secret": head.secret}
                token = uuid.uuid4().hex
                landed, retried = Answer(0, op, token), Answer(1, op, token)
                first.send(landed, fields, time.monotonic() + 30)
                again.send(retried, fields, time.monotonic() + 30)
                where = f"lineage {index}: {op} of pid {head.pid} at {head.generation}"
                if not landed.granted:
                    self._anomaly(f"{where}: not granted ({landed.reply})")
                    continue
                if not retried.granted or retried.identity != landed.identity:
                    self._anomaly(f"{where}: granted {landed.identity}, its retry {retried.reply}")
                    continue
                with self._lock:
                    self.stats[f"{op} retried after it landed"] += 1
                    if op == "bump":
                        self.bumps.append(landed.identity)
                        self.heads[index] = Head(head.pid, landed.identity[1], head.secret)
                    else:
                        self.rolls.append((head.pid, *landed.identity))
                        assert landed.reply is not None
                        self.heads[index] = Head(*landed.identity, bytes(landed.reply["secret"]))
        finally:
            first.close()
            again.close()

    def check_zookeeper(self) -> None:
        """Every grant of the run is in ZooKeeper (after the faults healed)."""
        for pid, generation in self.bumps:
            found = self._read(pid)
            if found is None or found[0].generation < generation:
                self._anomaly(f"bump to ({pid}, {generation}) missing from ZooKeeper: {found}")
        for pid, successor, generation in self.rolls:
            found, child = self._read(pid), self._read(successor)
            if found is None or (found[0].successor, found[0].successor_generation) != (
                successor,
                generation,
            ):
                self._anomaly(f"roll of {pid} into {successor} missing from ZooKeeper: {found}")
            if child is None or child[0].predecessor != pid:
                self._anomaly(f"record of successor {successor} missing or wrong: {child}")

    def save(self, path: Path) -> None:
        """The log, one round per line."""
        path.write_text("".join(json.dumps(line, default=repr) + "\n" for line in self.log))

    def close(self) -> None:
        self.reader.close()
