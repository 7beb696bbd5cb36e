"""The simulated sink: the real sink's batch path per partition, its state files and restarts.

Each batch of a partition is decided by the real sink's own step
(:func:`pidfence.spark_sink.partition_batch.judge_batch`, which ``process_partition`` calls before
it assembles its Arrow output): the per-record MAC check
(:func:`~pidfence.spark_sink.record_macs.mac_forged`), the adoption horizon opened where a batch
starts past the offsets it read (capped at the broker's clock plus the timestamp grace), the lease
servers asked through :class:`~pidfence.spark_sink.authority.BatchAuthority`,
the rules' batch path (:meth:`~pidfence.broker_plugin.ProducerStateTable.offer_batch`, its numpy
fast path included), the log order of header-less records and the gap reports
(:func:`~pidfence.spark_sink.gaps.seq_gaps`), all reported in :attr:`SimSink.gaps`. It verifies
``pfc`` certificates as ``pidfence sink --lease-public-key`` does (the real
:func:`pidfence.wire.cert.verify_cert`), unless the mutation ``no_verify`` turns that off. A batch
the lease servers do not answer is not committed, and runs again at the next one.

A restart rebuilds as the real sink does when its newest state file is lost
(:mod:`pidfence.spark_sink.state`): an older state file the real sink still keeps, then every
committed batch after it replayed through :func:`~pidfence.broker_plugin.replay_batch` from what
the batches decided (:func:`~pidfence.spark_sink.decisions.decided_rows`,
:func:`~pidfence.spark_sink.decisions.replay_rows`), with the horizon, the lease servers' answers
and the rules each recorded: never from Kafka, whose head may be gone. The rebuilt table must equal
the live one.
"""

from __future__ import annotations

import bisect
import copy
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from pidfence.broker_plugin import (
    VERDICT_CODES,
    ProducerStateTable,
    Verifier,
    decode_headers,
    replay_batch,
    rules_of,
)
from pidfence.pid_allocator import LeaseServerUnreachable
from pidfence.sim.kafka import KafkaRecord, SimKafka
from pidfence.sim.knobs import Knobs
from pidfence.sim.sink_tables import gaps_table, output_table
from pidfence.spark_sink.authority import BatchAuthority, recorded_answers
from pidfence.spark_sink.decisions import DECIDED_SCHEMA, replay_rows
from pidfence.spark_sink.gaps import GapReport, seq_gaps
from pidfence.spark_sink.partition_batch import judge_batch, with_non_idempotent
from pidfence.spark_sink.record_macs import mac_forged
from pidfence.spark_sink.schema import TS_TYPE
from pidfence.wire import PidStatus, Verdict
from pidfence.wire.mac import RecordMacCheck
from pidfence.wire.statement import PlacedCheck

if TYPE_CHECKING:
    from pidfence.pid_allocator import LeaseClient

CAPACITY = 64


class RebuildMismatch(AssertionError):
    """State rebuilt from an older state file plus the committed batches after it differs from
    the live state."""


@dataclass(frozen=True, slots=True)
class Span:
    """One committed batch of one partition, as its replay needs it (a manifest part): the
    records it read (``read[start:end]``), the horizon it opened, the lease servers' answers it
    recorded (None: it ran without ``--lease-server``) and the rules' settings it ran under.

    (The final batch's flush is never replayed: no restart follows it.)"""

    start: int
    end: int
    horizon: int | None
    answers: dict[str, list[Any]] | None
    rules: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Decided:
    """One partition's batch as the rules decided it (applied only once it commits)."""

    table: ProducerStateTable
    #: Every decision in order: ``(Kafka offset, verdict)`` (a record held then decided later
    #: in the batch appears once, with its final verdict).
    decisions: list[tuple[int, Verdict]]
    #: Kafka offsets of the appended records, in log order.
    log: list[int]
    #: ``(offset, pid, generation, seq)`` of the batch's records, as the batch decoded them.
    writers: list[tuple[int, int, int, int]]
    gaps: list[GapReport]
    horizon: int | None
    answers: dict[str, list[Any]] | None


class _Describe:
    """The simulated lease servers as :class:`BatchAuthority`'s client (it only asks
    ``describe``)."""

    def __init__(self, describe: Callable[[int], PidStatus]) -> None:
        self.describe = describe


@dataclass(eq=False)
class SimSink:
    """Decides every Kafka record once per committed batch, in Kafka-offset order (DESIGN §7).

    With ``public_keys`` (and no ``no_verify`` mutation) the rules verify ``pfc`` certificates.
    With an ``authority`` (the lease servers' ``describe``) it adopts producers beyond its
    horizons.
    """

    rng: random.Random
    knobs: Knobs
    kafka: SimKafka
    topic: str
    public_keys: list[Ed25519PublicKey] | None = None
    mac_secret: bytes | None = None
    authority: Callable[[int], PidStatus] | None = None

    def __post_init__(self) -> None:
        knobs = self.knobs
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
        #: Every decision the rules made, by verdict name (``BUFFERED``: a record still held at
        #: the end of its batch).
        self.verdicts: Counter[str] = Counter()
        #: Per partition, each decided record's latest verdict, by Kafka offset.
        self.verdict_at: list[dict[int, Verdict]] = [{} for _ in range(n)]
        #: Per partition, each decided record's (pid, generation, seq) as its batch decoded them
        #: (0 where missing or malformed), by Kafka offset: what the real sink commits with it.
        self.writer_at: list[dict[int, tuple[int, int, int]]] = [{} for _ in range(n)]
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
            try:
                done = self._decide(p, records, final)
            except LeaseServerUnreachable:
                self.unanswered += 1  # not committed: the next batch reads it again
                continue
            self.tables[p] = table = done.table
            self._commit(p, done)
            n = len(self.read[p])
            self.read[p].extend(records)
            if records:
                self.spans[p].append(
                    Span(n, len(self.read[p]), done.horizon, done.answers, rules_of(table))
                )
                self.committed[p] = records[-1].offset + 1
            self.forged_reasons.update(table.forged)
            table.forged.clear()
            if self.rng.random() < 0.5:
                chain = self.snapshots[p]
                # Mostly incremental, as the real sink stores state (a full file every so often).
                full = not chain or self.rng.random() < 0.25
                data = table.snapshot() if full else table.snapshot_delta()
                if full and (fulls := [i for i, (f, _, _) in enumerate(chain) if f]):
                    # What the real sink keeps when it writes a full file: the chain it loaded
                    # as a fallback, nothing older (spark_sink.state_files.drop_old_chains).
                    del chain[: fulls[-1]]
                    self.dropped[p] += fulls[-1]
                chain.append((full, data, len(self.read[p])))
                self.snapshot_counts["full" if full else "delta"] += 1

    def _decide(self, p: int, records: list[KafkaRecord], final: bool) -> _Decided:
        """One partition's batch, as ``process_partition`` decides it, on its table (a copy of it
        when the batch may fail for want of an answer).

        Raises:
            LeaseServerUnreachable: the authority had to be asked and no lease server answered.
        """
        table = self.tables[p]
        if self.authority is not None and self.knobs.lease_down_p:
            table = copy.deepcopy(table)
        decisions: list[tuple[int, Verdict]] = []
        log: list[int] = []
        writers: list[tuple[int, int, int, int]] = []
        gaps: list[GapReport] = []
        horizon = None
        authority = None
        if records:
            offsets = [r.offset for r in records]
            last_read = self.committed[p] - 1 if self.read[p] else None
            if self.authority is not None:
                authority = BatchAuthority(cast("LeaseClient", _Describe(self.authority)))
            headers = [r.header for r in records]
            forged = None
            if self.macs is not None:
                forged = mac_forged(
                    self.macs,
                    self.topic,
                    p,
                    decode_headers(headers),
                    pa.array([r.key for r in records], pa.binary()),
                    pa.array([r.value for r in records], pa.binary()),
                    pa.array([r.mac for r in records], pa.binary()),
                )
            certs = [r.cert for r in records] if table.verifier is not None else None
            ts_ms = [r.ts_ms for r in records]
            judged = judge_batch(
                table, headers, ts_ms, offsets, certs, forged, last_read, self.kafka.now, authority
            )
            res, horizon = judged.result, judged.horizon_ms
            gaps += [judged.unread] if judged.unread is not None else []
            released = [(int(d.ref), d.verdict) for d in res.released]
            decisions += zip(offsets, [VERDICT_CODES[c] for c in res.verdict.tolist()], strict=True)
            decisions += released
            order = with_non_idempotent(res.log_order, res.verdict).tolist()
            log = [offsets[i] if i >= 0 else released[-i - 1][0] for i in order]
            writers = list(
                zip(
                    offsets,
                    res.pid.tolist(),
                    res.generation.tolist(),
                    res.seq.tolist(),
                    strict=True,
                )
            )
            if table.gaps:
                gaps += seq_gaps(table.gaps, res.pid.tolist(), res.seq.tolist(), offsets)
                table.gaps.clear()
        if final:
            # The window closes at the table's own clock: flushing never moves time.
            decisions += [(int(d.ref), d.verdict) for d in table.flush(table.clock)]
        answers = None if authority is None else authority.recorded()
        return _Decided(table, decisions, log, writers, gaps, horizon, answers)

    def _commit(self, p: int, done: _Decided) -> None:
        """Record a committed batch's decisions: verdicts, log rows, rejects and gaps."""
        latest: dict[int, Verdict] = {}
        for offset, verdict in done.decisions:
            self.verdicts[verdict.value] += 1
            latest[offset] = verdict
        self.verdict_at[p].update(latest)
        self.writer_at[p].update((w[0], (w[1], w[2], w[3])) for w in done.writers)
        records = self.kafka.partitions[p]
        self.log[p] += [(records[offset], latest[offset]) for offset in done.log]
        self.rejects[p] += [
            (records[offset], v)
            for offset, v in sorted(latest.items())
            if v.final and not v.appended
        ]
        for g in done.gaps:
            if g.kind == "offsets":
                first = 0 if g.offset_before is None else g.offset_before + 1
                after = cast(int, g.offset_after)
                self.gaps.append((p, g.kind, None, None, first, after - 1, after))
            else:
                self.gaps.append(
                    (p, g.kind, g.pid, g.generation, g.seq_first, g.seq_last, g.offset_after)
                )

    def _restart(self, p: int) -> None:
        """Lose the in-memory table; rebuild it as the real sink does: from a random state file
        it still keeps (the current chain or the one before it), then the committed batches
        after it replayed through ``replay_batch``, each with what it recorded."""
        self.restarts += 1
        chain = self.snapshots[p]
        start = 0
        table: ProducerStateTable | None = None
        if chain:
            drawn = self.rng.randrange(self.dropped[p] + len(chain))
            pick = drawn - self.dropped[p]
            if pick < 0:
                # A state file the real sink no longer keeps: it starts from the oldest it keeps.
                pick, self.dropped[p] = 0, drawn
            first = max(i for i in range(pick + 1) if chain[i][0])
            full, deltas = chain[first][1], [d for _, d, _ in chain[first + 1 : pick + 1]]
            start = chain[pick][2]
            table = ProducerStateTable.restore_chain(full, deltas)
            # Newer state files describe the lost timeline; deltas continue from the pick.
            del chain[pick + 1 :]
        if table is None:
            table = self._table(p)
        table.verifier = self.verifier(p)
        spans = self.spans[p][bisect.bisect_left(self.spans[p], start, key=lambda sp: sp.start) :]
        if spans:
            rows = self._replay_rows(p, start)
            offsets = rows.column("offset").to_pylist()
            pf, ts_ms, verdicts = (rows.column(c).to_pylist() for c in ("pf", "ts_ms", "verdict"))
            read = self.read[p]
            for span in _merged(spans):
                # The part's records: its Kafka offsets (one read each, in offset order).
                a = bisect.bisect_left(offsets, read[span.start].offset)
                b = bisect.bisect_right(offsets, read[span.end - 1].offset)
                replay_batch(
                    table,
                    pf[a:b],
                    ts_ms[a:b],
                    verdicts[a:b],
                    offsets[a:b],
                    horizon_ms=span.horizon,
                    answers=recorded_answers(span.answers),
                    rules=span.rules,
                    signed=table.verifier is not None,
                )
        if table.state() != self.tables[p].state():
            raise RebuildMismatch(
                f"partition {p}: rebuild from record {start} read differs from the live state"
            )
        self.tables[p] = table

    def _replay_rows(self, p: int, start: int) -> pa.Table:
        """What a rebuild replays of the records read from ``read[start]`` on, as the real sink
        reads it back (:func:`pidfence.spark_sink.state.load_state`): the committed batches'
        decisions (:data:`~pidfence.spark_sink.decisions.DECIDED_SCHEMA`: the log's rows without
        a header, the rejects with their raw one) and the records still held, with their raw
        header, through :func:`~pidfence.spark_sink.decisions.replay_rows`, in Kafka-offset
        order."""
        records = self.read[p][start:]
        at, writers = self.verdict_at[p], self.writer_at[p]
        verdicts = [at[r.offset] for r in records]
        pid, generation, seq = zip(*(writers[r.offset] for r in records), strict=True)
        held = np.array([v is Verdict.BUFFERED for v in verdicts], dtype=bool)
        columns = {
            "offset": pa.array([r.offset for r in records], pa.int64()),
            "log_offset": pa.nulls(len(records), pa.int64()),
            "pid": pa.array(pid, pa.int64()),
            "generation": pa.array(generation, pa.int64()),
            "seq": pa.array(seq, pa.int64()),
            "timestamp": pa.array([r.ts_ms * 1000 for r in records], pa.int64()).cast(TS_TYPE),
            # The log's rows carry neither: a replay rebuilds their header from pid, gen, seq.
            "verdict": pa.array([None if v.appended else v.value for v in verdicts], pa.string()),
            "pf": pa.array(
                [None if v.appended else r.header for r, v in zip(records, verdicts, strict=True)],
                pa.binary(),
            ),
        }
        rows = pa.table(columns).cast(DECIDED_SCHEMA)
        pieces = [replay_rows(rows.filter(pa.array(~held)))]
        if held.any():
            # As a held file gives them: no verdict, the raw header.
            waiting = rows.filter(pa.array(held)).drop_columns(["verdict"])
            pieces.append(replay_rows(waiting, Verdict.BUFFERED.value))
        return pa.concat_tables(pieces).sort_by("offset")

    def expired_entries(self) -> int:
        """(partition, pid) pairs that had an entry (a record of theirs was appended or was a
        ``FENCE``) and have none at the end: the rules expired it (its lease ended)."""
        total = 0
        for p, verdicts in enumerate(self.verdict_at):
            records = self.kafka.partitions[p]
            had = {
                pf.pid
                for offset, verdict in verdicts.items()
                if verdict in (Verdict.APPENDED, Verdict.FENCE)
                and (pf := records[offset].pf()) is not None
            }
            total += sum(1 for pid in had if self.tables[p].get(pid) is None)
        return total

    def gaps_table(self) -> pa.Table:
        """The gaps reported, as ``pidfence.spark_sink.read_gaps`` lists them."""
        return gaps_table(self.topic, self.gaps)

    def tables_out(self) -> tuple[pa.Table, pa.Table]:
        """The output log and the rejects as pyarrow tables with the DESIGN §7 columns."""
        return output_table(self.topic, self.log, False), output_table(
            self.topic, self.rejects, True
        )


def _merged(spans: list[Span]) -> list[Span]:
    """The replay's calls: consecutive committed batches that recorded nothing a replay takes
    from its batch (no horizon opened, no lease server answer, the same rules) are replayed in
    one :func:`~pidfence.broker_plugin.replay_batch` call, every other batch on its own.

    The real sink replays batch by batch; across such cuts the rules' batch path decides
    exactly as record by record (its contract, which the live batches and this replay both
    lean on, and which a mismatch with the live state would show). Merging only spares the
    batch path's fixed cost per call, which made the simulation's restarts three times slower.
    """
    out: list[Span] = []
    for span in spans:
        last = out[-1] if out else None
        if (
            last is not None
            and last.horizon is None
            and span.horizon is None
            and not last.answers
            and not span.answers
            and (last.answers is None) == (span.answers is None)
            and last.rules == span.rules
        ):
            out[-1] = Span(last.start, span.end, None, last.answers, last.rules)
        else:
            out.append(span)
    return out
