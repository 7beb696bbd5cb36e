"""The simulated sink: the real broker rules per partition, batches, snapshots and restarts.

It verifies ``pfc`` certificates as ``pidfence sink --lease-public-key`` does (the real
:func:`pidfence.wire.cert.verify_cert`), unless the mutation ``no_verify`` turns that off. As the
real sink, it resolves gaps, and opens an adoption horizon when a batch starts past the offsets it
read (retention trimmed them: :meth:`~pidfence.sim.kafka.SimKafka.trim`, or it started at the end
of the log), reporting both in :attr:`SimSink.gaps`; there it asks the lease servers
(``pidfence sink --lease-server``: the simulated servers' ``describe``) and records their answers
with the batch. A batch the lease servers do not answer is not committed, and runs again at the
next one. A restart rebuilds from what the sink read (its committed input, batch by batch, with
the answers each batch recorded), never from Kafka, whose head may be gone.
"""

from __future__ import annotations

import bisect
import copy
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from pidfence.broker_plugin import (
    Authority,
    ProducerStateTable,
    Verifier,
    rebuild,
    recorded_authority,
)
from pidfence.pid_allocator import LeaseServerUnreachable
from pidfence.sim.kafka import KafkaRecord, SimKafka
from pidfence.sim.knobs import Knobs, Mutation
from pidfence.verify import REJECT_COLUMNS
from pidfence.wire import MalformedHeader, PidStatus, Verdict, decode_pf
from pidfence.wire.mac import RecordMacCheck
from pidfence.wire.statement import PlacedCheck

CAPACITY = 64


class RebuildMismatch(AssertionError):
    """State rebuilt from a snapshot plus the Kafka suffix differs from the live state."""


@dataclass(frozen=True, slots=True)
class Span:
    """One committed batch of one partition, as a replay needs it: the records it read
    (``read[start:end]``), the horizon it opened, the authority's answers it got (None: it ran
    without ``--lease-server``) and whether it closed the reorder window."""

    start: int
    end: int
    horizon: int | None
    answers: dict[int, PidStatus] | None
    flushed: bool


def _mutator(mutation: Mutation | None) -> Callable[[Verdict, bool], Verdict]:
    def mutate(verdict: Verdict, fence: bool) -> Verdict:
        if mutation == "accept_stale_generation" and verdict is Verdict.FENCED and not fence:
            return Verdict.APPENDED
        if mutation == "accept_old_seq" and verdict is Verdict.DUPLICATE:
            return Verdict.APPENDED
        return verdict

    return mutate


@dataclass(eq=False)
class SimSink:
    """Decides every Kafka record once per committed batch, in Kafka-offset order (DESIGN §7).

    ``drop_fence`` is applied at the input: FENCE records never reach the rules. With
    ``public_keys`` (and no ``no_verify`` mutation) the rules verify ``pfc`` certificates. With
    an ``authority`` (the lease servers' ``describe``) it adopts producers beyond its horizons.
    """

    rng: random.Random
    knobs: Knobs
    kafka: SimKafka
    topic: str
    public_keys: list[Ed25519PublicKey] | None = None
    mac_secret: bytes | None = None
    authority: Authority | None = None

    def __post_init__(self) -> None:
        knobs = self.knobs
        self.mutate = _mutator(knobs.mutation)
        #: Gap resolution, as the real sink does by default, when sessions deliver in order
        #: (``reorder=1``); a reordering client pairs with the proposal's rules.
        self.gaps_on = knobs.reorder == 1
        #: The certificate check, as ``leasePublicKey`` makes it (None: signing off).
        self.certificates: PlacedCheck | None = None
        if self.public_keys and knobs.mutation != "no_verify":
            self.certificates = PlacedCheck(self.public_keys)
        #: The per-record MAC check, as ``recordMacSecret`` makes it (None: the mode is off).
        self.macs = None if self.mac_secret is None else RecordMacCheck(self.mac_secret)
        n = len(self.kafka.partitions)
        self.tables = [self._table(p) for p in range(n)]
        self.committed = [0] * n
        #: Per partition, every record the sink read, in order (its committed input).
        self.read: list[list[KafkaRecord]] = [[] for _ in range(n)]
        #: Per partition, its committed batches (what a replay needs of each).
        self.spans: list[list[Span]] = [[] for _ in range(n)]
        #: Per partition, the first offset to read at the sink's first batch (its
        #: ``startingOffsets``: 0, or the end of the log for ``latest``).
        self.first_offset: list[int] | None = None
        #: Batches not committed because no lease server answered.
        self.unanswered = 0
        #: Every gap reported: (partition, kind, pid, generation, first seq, last seq, offset
        #: after); ``offsets`` gaps carry (None, None, first unread offset, last unread offset).
        self.gaps: list[tuple[Any, ...]] = []
        #: Per partition, the state files in order: ``(is_full, bytes, records read)``.
        self.snapshots: list[list[tuple[bool, bytes, int]]] = [[] for _ in range(n)]
        # Snapshots dropped from the front of each chain as the real sink drops old state files:
        # a restart still draws from all of them, so every schedule draws the same numbers.
        self.dropped = [0] * n
        self.snapshot_counts = {"full": 0, "delta": 0}
        self.log: list[list[tuple[KafkaRecord, Verdict]]] = [[] for _ in range(n)]
        self.rejects: list[list[tuple[KafkaRecord, Verdict]]] = [[] for _ in range(n)]
        self.batches = 0
        self.restarts = 0
        #: Every decision the rules made, by verdict name (``BUFFERED`` included).
        self.verdicts: Counter[str] = Counter()
        #: Per partition, each decided record's latest verdict, by Kafka offset.
        self.verdict_at: list[dict[int, Verdict]] = [{} for _ in range(n)]
        #: ``FORGED`` verdicts by reason (what the real sink's per-batch line counts).
        self.forged_reasons: Counter[str] = Counter()

    def verifier(self, partition: int) -> Verifier | None:
        """The broker rules' verifier of ``partition`` (None: signing off)."""
        check = self.certificates
        return None if check is None else check.for_partition(self.topic, partition)

    def _table(self, partition: int) -> ProducerStateTable:
        return ProducerStateTable(
            CAPACITY,
            self.knobs.lifetime_ms,
            verifier=self.verifier(partition),
            resolve_gaps=self.gaps_on,
        )

    def start_at_end(self) -> None:
        """``startingOffsets=latest``: the sink's first batch starts at the log's end now."""
        self.first_offset = [len(records) for records in self.kafka.partitions]

    def batch(self, final: bool = False) -> None:
        """One micro-batch over every partition; maybe restart first; snapshot after."""
        self.batches += 1
        for p in range(len(self.tables)):
            if self.rng.random() < self.knobs.restart_p:
                self._restart(p)
            start = max(self.committed[p], self.kafka.log_start[p])
            if self.first_offset is not None and not self.read[p]:
                start = max(start, self.first_offset[p])
            records = self.kafka.partitions[p][start:]
            horizon = records[0].ts_ms if records and start > self.committed[p] else None
            answers: dict[int, PidStatus] | None = None if self.authority is None else {}
            try:
                table, decided, gaps = self._decide(p, records, horizon, answers, final)
            except LeaseServerUnreachable:
                self.unanswered += 1  # not committed: the next batch reads it again
                continue
            self.tables[p] = table
            if horizon is not None:
                # Offsets the sink never read: it could not have seen producers start.
                self.gaps.append((p, "offsets", None, None, self.committed[p], start - 1, start))
            for offset, verdict in decided:
                self._record(p, offset, verdict)
            self.gaps.extend(gaps)
            n = len(self.read[p])
            self.read[p].extend(records)
            if records or final:
                self.spans[p].append(Span(n, len(self.read[p]), horizon, answers, final))
            if records:
                self.committed[p] = records[-1].offset + 1
            self.forged_reasons.update(table.forged)
            table.forged.clear()
            if self.rng.random() < 0.5:
                chain = self.snapshots[p]
                # Mostly incremental, as the real sink stores state (a full file every so often).
                full = not chain or self.rng.random() < 0.25
                data = table.snapshot() if full else table.snapshot_delta()
                if full and (fulls := [i for i, (f, _, _) in enumerate(chain) if f]):
                    # What the real sink keeps when it writes a full file: the newest older full
                    # chain as a fallback, nothing older (spark_sink.state_files.drop_old_chains).
                    del chain[: fulls[-1]]
                    self.dropped[p] += fulls[-1]
                chain.append((full, data, len(self.read[p])))
                self.snapshot_counts["full" if full else "delta"] += 1

    def _decide(
        self,
        p: int,
        records: list[KafkaRecord],
        horizon: int | None,
        answers: dict[int, PidStatus] | None,
        final: bool,
    ) -> tuple[ProducerStateTable, list[tuple[int, Verdict]], list[tuple[Any, ...]]]:
        """One partition's batch on its table (a copy of it when the batch may fail for want of
        an answer): the table after it, the decisions and the gaps.

        Raises:
            LeaseServerUnreachable: the authority had to be asked and no lease server answered.
        """
        table = self.tables[p]
        if answers is not None and self.knobs.lease_down_p:
            table = copy.deepcopy(table)
        table.authority = None if answers is None else self._asking(answers)
        decided: list[tuple[int, Verdict]] = []
        gaps: list[tuple[Any, ...]] = []
        if horizon is not None:
            table.open_horizon(horizon)
        for rec in records:
            if self.knobs.mutation == "drop_fence" and _is_fence(rec.header):
                continue
            if self.mac_refused(p, rec):
                # FORGED before the rules, as the real sink refuses it (no state change).
                decided.append((rec.offset, Verdict.FORGED))
                table.forged["mac"] = table.forged.get("mac", 0) + 1
                continue
            for decision in table.offer_header(rec.header, rec.ts_ms, rec.offset, rec.cert):
                decided.append((decision.ref, decision.verdict))
        if final:
            clock = max((r.ts_ms for r in self.kafka.partitions[p]), default=0)
            decided += [(d.ref, d.verdict) for d in table.flush(clock)]
        gaps += [(p, g.kind, g.pid, g.generation, g.first, g.last, g.ref) for g in table.gaps]
        table.gaps.clear()
        table.authority = None
        return table, decided, gaps

    def _asking(self, answers: dict[int, PidStatus]) -> Authority:
        """The authority of one batch: asks the lease servers once per pid, records answers."""
        assert self.authority is not None  # noqa: S101 - only called with one
        ask = self.authority

        def authority(pid: int) -> PidStatus:
            found = answers.get(pid)
            if found is None:
                found = ask(pid) or PidStatus.unknown(pid)
                answers[pid] = found
            return found

        return authority

    def _record(self, p: int, offset: int, verdict: Verdict) -> None:
        rec = self.kafka.partitions[p][offset]
        verdict = self.mutate(verdict, _is_fence(rec.header))
        self.verdicts[verdict.value] += 1
        self.verdict_at[p][offset] = verdict
        if verdict.appended:
            self.log[p].append((rec, verdict))
        elif verdict.final:
            self.rejects[p].append((rec, verdict))

    def _restart(self, p: int) -> None:
        """Lose the in-memory table; rebuild it from a random snapshot the real sink still keeps
        (the current chain or the one before it) + the records the sink read after it (reopening
        the horizons it opened there)."""
        self.restarts += 1
        chain = self.snapshots[p]
        snap: bytes | None = None
        start = 0
        base: ProducerStateTable | None = None
        if chain:
            drawn = self.rng.randrange(self.dropped[p] + len(chain))
            pick = drawn - self.dropped[p]
            if pick < 0:
                # A state file the real sink no longer keeps: it starts from the oldest it keeps.
                pick, self.dropped[p] = 0, drawn
            first = max(i for i in range(pick + 1) if chain[i][0])
            full, deltas = chain[first][1], [d for _, d, _ in chain[first + 1 : pick + 1]]
            start = chain[pick][2]
            base = ProducerStateTable.restore_chain(full, deltas)
            # rebuild() takes one full snapshot: flatten the chain on a separate copy, so the
            # table that goes on keeps its delta base at the picked snapshot.
            snap = ProducerStateTable.restore_chain(full, deltas).snapshot()
            # Newer state files describe the lost timeline; deltas continue from the pick.
            del chain[pick + 1 :]
        spans = self.spans[p][bisect.bisect_left(self.spans[p], start, key=lambda sp: sp.start) :]
        # rebuild() is the public path; it cannot carry refs, so held records come back with
        # ref None. The sink needs refs (Kafka offsets) to place released records, so it replays
        # with refs itself and checks both against the live state. rebuild() takes the committed
        # verdicts as the certificates' proof (the real sink does not store certs); the ref
        # replay verifies the real certs again: both must re-decide exactly as the live run.
        verdicts = self.verdict_at[p]
        # rebuild() cannot reopen a horizon mid-suffix nor change answers between batches; it is
        # checked where there is none.
        plain = None
        if not any(span.horizon is not None or span.answers for span in spans):
            plain = rebuild(
                snap,
                (
                    (r.header, r.ts_ms, verdicts.get(r.offset))
                    for r in self.read[p][start:]
                    if not (self.knobs.mutation == "drop_fence" and _is_fence(r.header))
                ),
                capacity=CAPACITY,
                lifetime_ms=self.knobs.lifetime_ms,
                resolve_gaps=self.gaps_on,
            )
        table = base if base is not None else self._table(p)
        table.verifier = self.verifier(p)
        for span in spans:
            table.authority = None if span.answers is None else recorded_authority(span.answers)
            if span.horizon is not None:
                table.open_horizon(span.horizon)
            for r in self.read[p][span.start : span.end]:
                if self.knobs.mutation == "drop_fence" and _is_fence(r.header):
                    continue
                if not self.mac_refused(p, r):
                    table.offer_header(r.header, r.ts_ms, r.offset, r.cert)
            if span.flushed:
                table.flush(max((r.ts_ms for r in self.kafka.partitions[p]), default=0))
        table.authority = None
        table.forged.clear()
        table.gaps.clear()
        live = self.tables[p].state()
        stale = plain is not None and _no_refs(plain.state()) != _no_refs(live)
        if table.state() != live or stale:
            raise RebuildMismatch(
                f"partition {p}: rebuild from offset {start} differs from the live state"
            )
        self.tables[p] = table

    def mac_refused(self, p: int, rec: KafkaRecord) -> bool:
        """Whether the per-record mode refuses ``rec``: an idempotent record (a well-formed
        ``pf`` with a pid) whose ``pfm`` does not verify."""
        if self.macs is None or rec.header is None:
            return False
        try:
            pf = decode_pf(rec.header)
        except MalformedHeader:
            return False
        if not pf.pid:
            return False
        return not self.macs.valid(
            self.topic, p, pf.pid, pf.generation, pf.seq, pf.flags, rec.key, rec.value, rec.mac
        )

    def expired_entries(self) -> int:
        """(partition, pid) pairs the rules knew and have since expired (lease ended)."""
        total = 0
        for p, records in enumerate(self.kafka.partitions):
            pids = set()
            for rec in records:
                if rec.header is not None:
                    pids.add(decode_pf(rec.header).pid)
            total += sum(1 for pid in pids if self.tables[p].get(pid) is None)
        return total

    def gaps_table(self) -> pa.Table:
        """The gaps reported, as ``pidfence.spark_sink.read_gaps`` lists them (the seq gaps'
        columns; ``offsets`` gaps carry no pid)."""
        rows = [g for g in self.gaps if g[1] != "offsets"]
        return pa.table(
            {
                "topic": [self.topic] * len(rows),
                "partition": [g[0] for g in rows],
                "kind": [g[1] for g in rows],
                "pid": [g[2] for g in rows],
                "generation": [g[3] for g in rows],
                "seq_first": [g[4] for g in rows],
                "seq_last": [g[5] for g in rows],
            },
            schema=pa.schema(
                [("topic", pa.string()), ("partition", pa.int32()), ("kind", pa.string())]
                + [(c, pa.int64()) for c in ("pid", "generation", "seq_first", "seq_last")]
            ),
        )

    def tables_out(self) -> tuple[pa.Table, pa.Table]:
        """The output log and the rejects as pyarrow tables with the DESIGN §7 columns."""
        return self._arrow(self.log, False), self._arrow(self.rejects, True)

    def _arrow(self, parts: list[list[tuple[KafkaRecord, Verdict]]], verdicts: bool) -> pa.Table:
        cols: dict[str, list[object]] = {k: [] for k in REJECT_COLUMNS}
        for p, rows in enumerate(parts):
            for i, (rec, verdict) in enumerate(rows):
                pid = gen = seq = 0
                if rec.header is not None:
                    try:
                        pf = decode_pf(rec.header)
                        pid, gen, seq = pf.pid, pf.generation, pf.seq
                    except MalformedHeader:
                        pass
                for k, v in (
                    ("topic", self.topic),
                    ("partition", p),
                    ("log_offset", i),
                    ("pid", pid),
                    ("generation", gen),
                    ("seq", seq),
                    ("key", rec.key),
                    ("value", rec.value),
                    ("offset", rec.offset),
                    ("timestamp", rec.ts_ms),
                    ("verdict", verdict.value),
                ):
                    cols[k].append(v)
        if not verdicts:
            del cols["verdict"]
        return pa.table(cols, schema=_schema(verdicts))


def _schema(verdicts: bool) -> pa.Schema:
    fields = [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("log_offset", pa.int64()),
        ("pid", pa.int64()),
        ("generation", pa.int32()),
        ("seq", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
    ]
    if verdicts:
        fields.append(("verdict", pa.string()))
    return pa.schema(fields)


def _is_fence(header: bytes | None) -> bool:
    if header is None:
        return False
    try:
        return bool(decode_pf(header).flags & 1)
    except MalformedHeader:
        return False


def _no_refs(state: tuple[Any, ...]) -> tuple[Any, ...]:
    """A table's :meth:`~ProducerStateTable.state` without the refs of held and waiting
    records (what :func:`rebuild` cannot restore)."""
    *settings, held_rows, waiting, unconfirmed = state
    held = tuple(h[:-1] for h in held_rows)
    pending = tuple((*w[:3], *(r[:-1] for r in w[3:])) for w in waiting)
    return (*settings, held, pending, unconfirmed)
