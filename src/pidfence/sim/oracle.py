"""The oracle: the proposal's strict rules on a full view of the log, compared per event.

Jepsen-style (DESIGN §10 amended): a schedule is judged against a reference, not against the
implementation's idea of itself. The reference is a default
:class:`~pidfence.broker_plugin.ProducerStateTable` (no gap resolution, no horizon, no
authority), with the sink's capacity, lifetime, reorder window and certificate check, run on
everything any producer wrote to each partition: what retention trimmed, what the sink skipped
when it started at the end, and what Kafka acknowledged and lost (at the offset it was told).

The sink's output is compared with it per event (DESIGN §9), the upstream event being the
record's value:

* **appended wrongly**: an event the sink appended that the strict rules append under no
  record. The one relaxation allowed: a record past a hole that the strict rules refused
  (``OUT_OF_ORDER`` or ``FENCED`` at its release after waiting behind it; or ``OUT_OF_ORDER``
  on arrival past the reorder window, the record that overflows it, past a ``lost`` gap of its
  pid the sink reported), where no record of a newer generation of its pid came before it in
  the log: gap resolution appends exactly those,
  and a hole that stays open lets its resumer fill it (DESIGN §4 amended a third time).
  Likewise a record the strict rules call ``UNKNOWN_PID`` only because its pid's head on the
  partition was never written (no earlier record of the pid there got any other verdict: a
  librdkafka timeout hole at seq 0), no newer generation of its pid before it, past the ``head``
  gap the sink reported for its generation: adoption keeps that head open for the resume's
  re-sends as gap resolution keeps a hole (docs/gaps.md, "A skipped gap stays open").
  Also, whatever its event: a record the strict rules ``FENCED`` on arrival (a zombie's: a
  newer generation of its pid was on the partition before it). Its successor's copy of the
  event, appended by the strict rules, may be one the sink never read (retention deleted it with
  the FENCE), so per event nothing shows; the order of the log still forbids it.
* **refused wrongly**: an event the strict rules append that the sink has not, unless every
  record the strict rules appended for it is one the sink could not read (trimmed, before its
  start, lost by Kafka), is held behind one that nothing passed
  (:class:`~pidfence.sim.losses.Losses`' collateral: the relaxed rules *may* append after a loss),
  or was refused ``UNVERIFIED``: under signing, adoption needs the producer's next certificate
  (DESIGN §3 amended again; the sink cannot prove the records before it).
* **twice**: an event the sink appended more than once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pidfence.broker_plugin import ProducerStateTable, Verifier
from pidfence.sim.kafka import KafkaRecord, SimKafka
from pidfence.wire import Verdict
from pidfence.wire.mac import RecordMacCheck

#: (partition, Kafka offset) of a record the sink read.
Place = tuple[int, int]


@dataclass(frozen=True)
class StrictRecord:
    """One record of the full view with the strict rules' decision."""

    partition: int
    #: The record's Kafka offset; a lost record's is ``-1 - n`` (the ``n``-th loss of the
    #: partition: no offset of its own).
    place: int
    record: KafkaRecord
    verdict: Verdict
    #: The strict rules held it first (it waited behind a hole).
    held: bool
    #: A record of a newer generation of its pid came before it on the partition.
    after_newer: bool
    lost: bool
    #: ``UNKNOWN_PID`` with no earlier record of its pid on the partition judged otherwise: the
    #: strict rules never had an entry for it (its seq 0 was never written there).
    unstarted: bool = False


@dataclass
class OracleReport:
    """What the oracle found; each list holds examples (all of them: schedules are small)."""

    appended_wrongly: list[dict[str, Any]] = field(default_factory=list)
    refused_wrongly: list[dict[str, Any]] = field(default_factory=list)
    twice: list[dict[str, Any]] = field(default_factory=list)
    #: How many events each excuse covered (for the schedule's stats).
    excused: Counter[str] = field(default_factory=Counter)
    #: The events the sink left out that the strict rules append only under records it could
    #: not read or could not verify (``UNVERIFIED``): the losses the docs name.
    named_losses: set[bytes] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        """No difference from the strict rules beyond the allowed ones."""
        return not (self.appended_wrongly or self.refused_wrongly or self.twice)

    def summary(self) -> str:
        """One line for failure messages."""
        if self.ok:
            return "oracle ok"
        return (
            f"oracle: {len(self.appended_wrongly)} appended wrongly, "
            f"{len(self.refused_wrongly)} refused wrongly, {len(self.twice)} twice; e.g. "
            f"{(self.appended_wrongly + self.refused_wrongly + self.twice)[:3]}"
        )


def full_view(kafka: SimKafka, partition: int) -> list[tuple[int, KafkaRecord, bool]]:
    """Every record written to ``partition`` in log order: ``(place, record, lost)``, a lost
    record just before the record that got the offset it was told."""
    lost_at: dict[int, list[KafkaRecord]] = defaultdict(list)
    for p, rec in kafka.lost:
        if p == partition:
            lost_at[rec.offset].append(rec)
    out: list[tuple[int, KafkaRecord, bool]] = []
    n = 0
    for rec in kafka.partitions[partition]:
        for gone in lost_at.pop(rec.offset, ()):
            out.append((-1 - n, gone, True))
            n += 1
        out.append((rec.offset, rec, False))
    for rest in lost_at.values():
        for gone in rest:
            out.append((-1 - n, gone, True))
            n += 1
    return out


def strict_decisions(
    kafka: SimKafka,
    partition: int,
    capacity: int,
    lifetime_ms: int,
    verifier: Verifier | None,
    mac_refused: Callable[[int, KafkaRecord], bool],
) -> list[StrictRecord]:
    """The strict rules' decision for every record of the partition's full view."""
    table = ProducerStateTable(capacity, lifetime_ms, verifier=verifier)
    view = full_view(kafka, partition)
    final: dict[int, Verdict] = {}
    held: set[int] = set()
    newest: dict[int, int] = {}
    after_newer: set[int] = set()
    order: list[tuple[int, int]] = []
    for place, rec, _ in view:
        pf = pf_of(rec)
        if pf is not None:
            if newest.get(pf[0], -1) > pf[1]:
                after_newer.add(place)
            newest[pf[0]] = max(newest.get(pf[0], -1), pf[1])
            order.append((pf[0], place))
        if mac_refused(partition, rec):
            final[place] = Verdict.FORGED
            continue
        for d in table.offer_header(rec.header, rec.ts_ms, place, rec.cert):
            final[d.ref] = d.verdict
            if d.verdict is Verdict.BUFFERED:
                held.add(d.ref)
    end = max((rec.ts_ms for _, rec, _ in view), default=0)
    for d in table.flush(max(end, table.clock)):
        final[d.ref] = d.verdict
    started: set[int] = set()
    unstarted: set[int] = set()
    for pid, place in order:
        if final[place] is not Verdict.UNKNOWN_PID:
            started.add(pid)
        elif pid not in started:
            unstarted.add(place)
    return [
        StrictRecord(
            partition,
            place,
            rec,
            final[place],
            place in held,
            place in after_newer,
            lost,
            place in unstarted,
        )
        for place, rec, lost in view
    ]


def judge(
    strict: Sequence[StrictRecord],
    appended: Sequence[tuple[int, KafkaRecord]],
    read: set[Place],
    collateral: set[tuple[int, int, int]],
    relaxed: Sequence[dict[int, Verdict]] = (),
    gaps: Sequence[tuple[Any, ...]] = (),
) -> OracleReport:
    """Compare the sink's appended records with the strict rules' decisions, per event.

    Args:
        strict: :func:`strict_decisions` of every partition.
        appended: the sink's log: ``(partition, record)`` of each idempotent record it appended.
        read: ``(partition, offset)`` of every record the sink read.
        collateral: ``(pid, partition, seq)`` of records held behind a Kafka loss nothing
            passed (:attr:`~pidfence.sim.losses.Losses.collateral`).
        relaxed: per partition, the sink's final verdict by Kafka offset.
        gaps: the gaps the sink reported, ``(partition, kind, pid, generation, seq_first,
            seq_last, offset_after)``: a record the strict rules refused past the reorder window
            (never held) is excused only past a ``lost`` gap of its pid the sink reported.
    """
    skipped: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    heads: dict[tuple[int, int, int], list[tuple[int, int]]] = defaultdict(list)
    for partition, kind, pid, generation, _first, last, after in gaps:
        if kind == "lost":
            skipped[(partition, pid)].append((last, after))
        if kind == "head":
            heads[(partition, pid, generation)].append((last, after))
    report = OracleReport()
    by_place = {(s.partition, s.place): s for s in strict}
    seen_seqs: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for s in strict:
        pf = pf_of(s.record)
        if pf is None or (s.partition, s.place) not in read:
            continue
        if s.partition < len(relaxed) and relaxed[s.partition].get(s.place) is Verdict.UNVERIFIED:
            continue  # under signing the sink adopts at a certificate: what came before stays open
        seen_seqs[(s.partition, pf[0])].append((pf[2], s.place))
    strict_events: dict[bytes, list[StrictRecord]] = defaultdict(list)
    for s in strict:
        if s.verdict is Verdict.APPENDED and pf_of(s.record) is not None:
            strict_events[s.record.value].append(s)
    counts = Counter(rec.value for _, rec in appended)
    for value, n in counts.items():
        if n > 1:
            report.twice.append({"event": value, "times": n})
    for partition, rec in appended:
        s = by_place[(partition, rec.offset)]
        if s.verdict is Verdict.FENCED and not s.held:
            report.appended_wrongly.append(_example(s))  # a zombie's, even of a logged event
            continue
        if rec.value in strict_events:
            continue
        pf = pf_of(rec)
        past_a_gap = pf is not None and any(
            last < pf[2] and after <= rec.offset for last, after in skipped[(partition, pf[0])]
        )
        refused = (Verdict.OUT_OF_ORDER, Verdict.FENCED)
        behind_a_hole = (s.held and s.verdict in refused) or (
            s.verdict is Verdict.OUT_OF_ORDER and past_a_gap  # the one that overflowed
        )
        if behind_a_hole and not s.after_newer:
            report.excused["gap_resolution"] += 1
            continue
        # A head gap is the sink's word; it counts only if the sink read no record of that
        # head before the gap, except ones it could not verify (it adopts at a certificate).
        past_an_open_head = (
            pf is not None
            and s.unstarted
            and any(
                last < pf[2]
                and after <= rec.offset
                and not any(
                    seq <= last and place < after for seq, place in seen_seqs[(partition, pf[0])]
                )
                for last, after in heads[(partition, pf[0], pf[1])]
            )
        )
        if past_an_open_head and not s.after_newer:
            report.excused["unwritten_head"] += 1
            continue
        report.appended_wrongly.append(_example(s))
    for value, records in strict_events.items():
        if value in counts:
            continue
        unseen = [s for s in records if s.lost or (s.partition, s.place) not in read]
        if len(unseen) == len(records):
            report.excused["unseen"] += 1
            report.named_losses.add(value)
            continue
        if all(
            s in unseen or relaxed[s.partition].get(s.place) is Verdict.UNVERIFIED for s in records
        ):
            report.excused["unverified"] += 1
            report.named_losses.add(value)
            continue
        pf = pf_of(records[0].record)
        if pf is not None and (pf[0], records[0].partition, pf[2]) in collateral:
            report.excused["behind_a_loss"] += 1
            continue
        report.refused_wrongly.append(_example(records[0]))
    return report


def mac_refusal(topic: str, secret: bytes | None) -> Callable[[int, KafkaRecord], bool]:
    """The oracle's own per-record MAC check (its own :class:`RecordMacCheck`, not the
    sink's): whether the per-record mode refuses a record of ``topic`` (an idempotent record,
    data or FENCE, whose ``pfm`` does not verify). Without a ``secret`` the mode is off."""
    check = None if secret is None else RecordMacCheck(secret)

    def refused(partition: int, rec: KafkaRecord) -> bool:
        pf = None if check is None else rec.pf()
        if check is None or pf is None:
            return False
        return not check.valid(
            topic, partition, pf.pid, pf.generation, pf.seq, pf.flags, rec.key, rec.value, rec.mac
        )

    return refused


def pf_of(rec: KafkaRecord) -> tuple[int, int, int] | None:
    """(pid, generation, seq) of an idempotent record, else None."""
    pf = rec.pf()
    return None if pf is None else (pf.pid, pf.generation, pf.seq)


def _example(s: StrictRecord) -> dict[str, Any]:
    pf = pf_of(s.record)
    return {
        "partition": s.partition,
        "offset": s.place,
        "pid_generation_seq": pf,
        "strict": s.verdict.value,
        "held": s.held,
        "value": s.record.value[:60],
    }
