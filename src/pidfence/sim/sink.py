"""The simulated sink: the real broker rules per partition, batches, snapshots and restarts.

It verifies ``pfc`` certificates as ``pidfence sink --lease-public-key`` does (the real
:func:`pidfence.wire.cert.verify_cert`), unless the mutation ``no_verify`` turns that off. As the
real sink, it resolves gaps, and opens an adoption horizon when a batch starts past the offsets it
read (retention trimmed them: :meth:`~pidfence.sim.kafka.SimKafka.trim`), reporting both in
:attr:`SimSink.gaps`. A restart rebuilds from what the sink read (its committed input), never
from Kafka, whose head may be gone.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from pidfence.broker_plugin import ProducerStateTable, Verifier, rebuild
from pidfence.sim.kafka import KafkaRecord, SimKafka
from pidfence.sim.knobs import Knobs, Mutation
from pidfence.verify import REJECT_COLUMNS
from pidfence.wire import MalformedHeader, Verdict, decode_pf
from pidfence.wire.mac import RecordMacCheck
from pidfence.wire.statement import PlacedCheck

CAPACITY = 64


class RebuildMismatch(AssertionError):
    """State rebuilt from a snapshot plus the Kafka suffix differs from the live state."""


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
    ``public_keys`` (and no ``no_verify`` mutation) the rules verify ``pfc`` certificates.
    """

    rng: random.Random
    knobs: Knobs
    kafka: SimKafka
    topic: str
    public_keys: list[Ed25519PublicKey] | None = None
    mac_secret: bytes | None = None

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
        #: Per partition, read index -> the horizon opened before reading that record.
        self.horizons: list[dict[int, int]] = [{} for _ in range(n)]
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

    def batch(self, final: bool = False) -> None:
        """One micro-batch over every partition; maybe restart first; snapshot after."""
        self.batches += 1
        for p in range(len(self.tables)):
            if self.rng.random() < self.knobs.restart_p:
                self._restart(p)
            start = max(self.committed[p], self.kafka.log_start[p])
            records = self.kafka.partitions[p][start:]
            table = self.tables[p]
            if records and start > self.committed[p]:
                # Offsets the sink never read: it could not have seen producers start.
                table.open_horizon(records[0].ts_ms)
                self.horizons[p][len(self.read[p])] = records[0].ts_ms
                self.gaps.append((p, "offsets", None, None, self.committed[p], start - 1, start))
            for rec in records:
                header = rec.header
                if self.knobs.mutation == "drop_fence" and _is_fence(header):
                    continue
                if self._mac_refused(p, rec):
                    # FORGED before the rules, as the real sink refuses it (no state change).
                    self._record(p, rec.offset, Verdict.FORGED)
                    self.forged_reasons["mac"] += 1
                    continue
                for decision in table.offer_header(header, rec.ts_ms, rec.offset, rec.cert):
                    self._record(p, decision.ref, decision.verdict)
                self._collect_gaps(p, table)
            if final:
                clock = max((r.ts_ms for r in self.kafka.partitions[p]), default=0)
                for decision in table.flush(clock):
                    self._record(p, decision.ref, decision.verdict)
                self._collect_gaps(p, table)
            self.read[p].extend(records)
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

    def _collect_gaps(self, p: int, table: ProducerStateTable) -> None:
        for gap in table.gaps:
            self.gaps.append((p, gap.kind, gap.pid, gap.generation, gap.first, gap.last, gap.ref))
        table.gaps.clear()

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
        suffix = self.read[p][start:]
        horizons = {i - start: ms for i, ms in self.horizons[p].items() if i >= start}
        if self.knobs.mutation == "drop_fence":
            # Fences never reached the rules; keep the horizon positions on the remaining ones.
            kept = [(i, r) for i, r in enumerate(suffix) if not _is_fence(r.header)]
            horizons = {j: horizons[i] for j, (i, _) in enumerate(kept) if i in horizons} | {
                len(kept): ms for i, ms in horizons.items() if i >= len(suffix)
            }
            suffix = [r for _, r in kept]
        # rebuild() is the public path; it cannot carry refs, so held records come back with
        # ref None. The sink needs refs (Kafka offsets) to place released records, so it replays
        # with refs itself and checks both against the live state. rebuild() takes the committed
        # verdicts as the certificates' proof (the real sink does not store certs); the ref
        # replay verifies the real certs again: both must re-decide exactly as the live run.
        verdicts = self.verdict_at[p]
        # rebuild() cannot reopen a horizon mid-suffix; it is checked where there is none.
        plain = None
        if not horizons:
            plain = rebuild(
                snap,
                ((r.header, r.ts_ms, verdicts.get(r.offset)) for r in suffix),
                capacity=CAPACITY,
                lifetime_ms=self.knobs.lifetime_ms,
                resolve_gaps=self.gaps_on,
            )
        table = base if base is not None else self._table(p)
        table.verifier = self.verifier(p)
        for i, r in enumerate(suffix):
            if i in horizons:
                table.open_horizon(horizons[i])
            if not self._mac_refused(p, r):
                table.offer_header(r.header, r.ts_ms, r.offset, r.cert)
        table.forged.clear()
        table.gaps.clear()
        live = self.tables[p].state()
        stale = plain is not None and _no_refs(plain.state()) != _no_refs(live)
        if table.state() != live or stale:
            raise RebuildMismatch(
                f"partition {p}: rebuild from offset {start} differs from the live state"
            )
        self.tables[p] = table

    def _mac_refused(self, p: int, rec: KafkaRecord) -> bool:
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
    return (*state[:-1], tuple(h[:-1] for h in state[-1]))
