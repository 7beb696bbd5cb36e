"""Recovery scan: what the instance before a resume got into Kafka after its checkpoint.

A checkpoint is stored after a flush, but its owner goes on sending; when it dies (or is fenced),
the records it got acknowledged after the checkpoint are in Kafka under its pid. The resumer
re-sends them in the same order: under the same pid and seqs they are ``DUPLICATE`` and dropped,
but a resumer that rolls over before it re-sent all of them would send the rest under the
successor pid, where nothing deduplicates them (DESIGN §9). So a resume reads the raw partitions
once, from the checkpoint's time up to its own FENCE records, and learns the highest seq each
pid of the lineage reached per partition; the producer uses it to keep re-sending under the old
pid, or to skip those records after a rollover (``Sequencer.skip``). No I/O here: the reader
over a real cluster is :class:`~pidfence.producer.kafka_scan.KafkaScanner`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pidfence.broker_plugin import ProducerStateTable, Verifier
from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.sequencer import Sequencer
from pidfence.wire import (
    CERT_HEADER_KEY,
    FLAG_FENCE,
    MAC_HEADER_KEY,
    PF_HEADER_KEY,
    MalformedHeader,
    decode_pf,
)
from pidfence.wire.mac import mac_matches, record_hasher, record_mac_from

#: ``verifier(topic, partition)``: the broker rules' verifier of that partition (what the sink's
#: ``leasePublicKey`` makes: :meth:`pidfence.wire.statement.PlacedCheck.for_partition`).
CertVerifier = Callable[[str, int], Verifier]

#: pid -> (topic, partition) -> highest seq of a data record seen.
Highs = dict[int, dict[TopicPartition, int]]
#: pid -> (topic, partition) -> the seqs below its high the sink skipped as a gap (open holes),
#: ``(first, last)`` ascending.
Holes = dict[int, dict[TopicPartition, list[tuple[int, int]]]]


#: ``scanner(state, partitions, since_ms, until)``: reads the raw partitions and feeds ``state``
#: the records of ``partitions`` from the first one at or after ``since_ms`` up to ``until`` (an
#: exclusive end offset per partition: this resumer's FENCE record; partitions without one are
#: read to their current end). Over a real cluster:
#: :class:`~pidfence.producer.kafka_scan.KafkaScanner`.
Scanner = Callable[["ScanState", Iterable[TopicPartition], int, Mapping[TopicPartition, int]], None]


class ScanState:
    """Per (pid, partition): the highest seq the sink's rules append, from raw records.

    Records are fed in offset order per partition and judged by the broker rules themselves
    (:class:`~pidfence.broker_plugin.ProducerStateTable`, with the sink's gap resolution,
    on by default), for the scanned pids only. So a record counts exactly when the sink appends
    it: FENCED, held, refused and forged records do not, and a record past a hole the window
    overflowed does (the sink reports the hole as a gap and goes on). A record that does not
    count must still be re-sent; one that counts must not be sent again under another pid.

    Args:
        pids: the pids to follow.
        base: per pid and partition, the highest seq known to be appended before the scan
            starts (a checkpoint's ``next_seq - 1``); -1 where unknown.
        generations: per pid, the generation the rules already hold on every partition when
            the scan starts (a checkpoint's: it is taken after the resume's FENCEs landed).
        window: the sink's reorder window.
        verifier: the sink's certificate check per partition (``leasePublicKey``), or None.
        resolve_gaps: the sink's ``resolveGaps``: with it off, a record past a hole stays held
            (and a generation move FENCEs it) instead of counting.
        macs: per pid, its record MAC key (the per-record mode): a record of that pid whose
            ``pfm`` does not verify does not count (the sink calls it ``FORGED``), so a record a
            topic writer injected at the pid's next seq is never taken for one of its own.
        fenced: the checkpoint's FENCEd partitions and generations (the sink holds an entry
            for the checkpoint's pid there).
        holes: per pid and partition, the open holes below ``base`` (a checkpoint's
            ``ahead_holes``): seqs an earlier scan saw skipped, which a re-send may fill.
        lease_ends: per pid, a generation and the latest timestamp a record of that lease can
            carry (its end plus ``ProducerConfig.scan_late_ms``). A later record of that
            generation is a topic writer's, never the pid's: a sink whose entry expired
            refuses it, so it never counts (counted, a successor would skip the event it
            stands in for).
    """

    def __init__(
        self,
        pids: set[int],
        base: Mapping[int, Mapping[TopicPartition, int]] | None = None,
        generations: Mapping[int, int] | None = None,
        window: int = 5,
        verifier: CertVerifier | None = None,
        resolve_gaps: bool = True,
        macs: Mapping[int, bytes] | None = None,
        fenced: Mapping[TopicPartition, int] | None = None,
        holes: Mapping[int, Mapping[TopicPartition, Iterable[tuple[int, int]]]] | None = None,
        lease_ends: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        self.pids = pids
        self._lease_ends = dict(lease_ends or {})
        self._base_holes = {
            pid: {tp: list(ranges) for tp, ranges in by_tp.items()}
            for pid, by_tp in (holes or {}).items()
        }
        self._fenced = dict(fenced or {})
        self._resolve_gaps = resolve_gaps
        # Keyed once per pid: a scan reads every record the predecessor wrote.
        self._macs = {pid: record_hasher(key) for pid, key in (macs or {}).items()}
        self._verifier = verifier
        self._base = {pid: dict((base or {}).get(pid, {})) for pid in pids}
        self._base_gen = dict(generations or {})
        self._window = window
        self._tables: dict[TopicPartition, ProducerStateTable] = {}
        self._unsure: set[tuple[int, TopicPartition]] = set()
        self._head_deleted: set[TopicPartition] = set()

    def head_deleted(self, tp: TopicPartition) -> None:
        """Say that the scan of ``tp`` starts at the first offset retention left, so records of
        the pid from after the checkpoint may be gone (the scanner's call, before any record)."""
        self._head_deleted.add(tp)

    @property
    def highs(self) -> Highs:
        """pid -> (topic, partition) -> the highest seq the rules appended (base included)."""
        out: Highs = {pid: dict(known) for pid, known in self._base.items()}
        for tp, table in self._tables.items():
            for pid in self.pids:
                entry = table.get(pid)
                if entry is not None and entry[1] >= 0:
                    out[pid][tp] = max(out[pid].get(tp, -1), entry[1])
        return out

    @property
    def holes(self) -> Holes:
        """pid -> (topic, partition) -> the open holes below its high: what the rules skipped
        as a gap (a timeout hole), so the sink has nothing of those seqs."""
        out: Holes = {pid: dict(by_tp) for pid, by_tp in self._base_holes.items()}
        for tp, table in self._tables.items():
            for pid in self.pids:
                if table.get(pid) is not None:
                    out.setdefault(pid, {})[tp] = list(table.open_holes(pid))
        return out

    def _table(self, tp: TopicPartition) -> ProducerStateTable:
        table = self._tables.get(tp)
        if table is None:
            # Nothing expires during a scan, and no live state is ever evicted.
            table = self._tables[tp] = ProducerStateTable(
                capacity=len(self.pids) + 1,
                lifetime_ms=_NEVER,
                reorder_window=self._window,
                verifier=None if self._verifier is None else self._verifier(*tp),
                resolve_gaps=self._resolve_gaps,
            )
            for pid, generation in self._base_gen.items():
                # The resume's FENCEs put the pid at its generation on every partition.
                table.create(pid, generation, self._base[pid].get(tp, -1), 0)
                known = self._base_holes.get(pid, {}).get(tp)
                if known:
                    table.entries[pid].holes = [[a, b] for a, b in known]
                if tp not in self._base[pid] and self._fenced.get(tp) != generation:
                    # Unless the checkpoint FENCEd nothing there (a fresh lease's): the sink
                    # may hold no entry, and a first record must prove itself.
                    self._unsure.add((pid, tp))
        return table

    def note(
        self,
        tp: TopicPartition,
        headers: Iterable[tuple[str, Any]] | None,
        ts_ms: int = 0,
        key: bytes | None = None,
        value: bytes | None = None,
    ) -> None:
        """Feed one raw record of ``tp`` (its headers, timestamp, key and value), in offset
        order."""
        found: dict[str, Any] = {}
        for name, header in headers or ():
            found.setdefault(name, header)
        pf_value = found.get(PF_HEADER_KEY)
        if pf_value is None:
            return
        cert: bytes | None = found.get(CERT_HEADER_KEY)
        try:
            pf = decode_pf(pf_value)
        except MalformedHeader:
            return
        ended = self._lease_ends.get(pf.pid)
        if ended is not None and pf.generation == ended[0] and ts_ms > ended[1]:
            return
        hasher = self._macs.get(pf.pid)
        if hasher is not None and not mac_matches(
            record_mac_from(
                hasher, tp[0], tp[1], pf.pid, pf.generation, pf.seq, pf.flags, key, value
            ),
            found.get(MAC_HEADER_KEY),
        ):
            return
        if pf.pid in self.pids:
            table = self._table(tp)
            if (pf.pid, tp) in self._unsure:
                if not self._first_proven(
                    tp, table, pf.pid, pf.generation, pf.seq, pf.flags, cert, ts_ms
                ):
                    return
                self._unsure.discard((pf.pid, tp))
            table.offer(pf.pid, pf.generation, pf.seq, ts_ms, pf.flags, cert=cert)
            table.forged.clear()
            table.gaps.clear()

    def _first_proven(
        self,
        tp: TopicPartition,
        table: ProducerStateTable,
        pid: int,
        g: int,
        seq: int,
        flags: int,
        cert: bytes | None,
        ts_ms: int,
    ) -> bool:
        """Whether the first record of ``pid`` on an unsure partition counts, judged as a sink
        that holds no entry there judges it (an older generation is still judged, and FENCED,
        by the table).

        A first record past seq 0 whose head the scan would have read (retention deleted none
        of the partition since the checkpoint) started where the pid's head never reached
        Kafka (a librdkafka timeout at seq 0): a sink that read the partition from before the
        pid started calls it ``UNKNOWN_PID``, so it does not count and the successor sends its
        event again. With a verifier, a record of the checkpoint's generation must prove itself.
        """
        if g != self._base_gen.get(pid):
            return True
        if seq > 0 and not flags & FLAG_FENCE and tp not in self._head_deleted:
            return False
        verify = table.verifier
        if verify is None:
            return True
        return verify(pid, g, seq, flags, cert, max(table.clock, ts_ms)) is None


#: One partition's skip runs, in order: (records, the positions of the run sent after all;
#: see :attr:`pidfence.producer.sequencer.Sequencer.resend`).
SkipPlan = list[tuple[int, list[tuple[int, int]]]]


def sent_anyway(holes: Iterable[tuple[int, int]], low: int, end: int) -> list[tuple[int, int]]:
    """The positions (counted back from the run's end) of a skip run standing for seqs
    ``low..end-1`` whose seqs are in ``holes``: the sink has nothing of them, so a successor
    sends them instead of skipping them."""
    out = []
    for hole_first, hole_last in holes:
        first, last = max(hole_first, low), min(hole_last, end - 1)
        if first <= last:
            out.append((end - first, end - last))
    return out


def handover(current: Sequencer) -> dict[TopicPartition, SkipPlan]:
    """What the successor of ``current`` must skip, per partition: ``current``'s unsent
    skips, then the records an earlier instance of its pid got into Kafka that it has not
    re-sent yet (the recovery scan's ``ahead``): the successor's seqs would not deduplicate
    them. The holes among them (``ahead_holes``) are sent: the sink has nothing of them."""
    plans: dict[TopicPartition, SkipPlan] = {}
    for tp in set(current.skip) | set(current.ahead):
        runs: SkipPlan = [(current.skip.get(tp, 0), list(current.resend.get(tp, ())))]
        at, target = current.peek(*tp), current.ahead.get(tp, 0)
        if target > at:
            runs = after_pid(runs, at, target, current.ahead_holes.get(tp, ()))
        plans[tp] = runs
    return plans


def scan_keys(
    checkpoint: ProducerCheckpoint, current: Sequencer, followed: int | None = None
) -> dict[int, bytes]:
    """The MAC keys a resume's scan checks records with (per-record mode): the checkpoint's
    pid's (stored in it), the resumed lease's pid's, and a rolled pid's (the roll's answer
    carries it: the checkpoint's pid, or ``followed`` when the resume rolled past it)."""
    keys: dict[int, bytes] = {}
    if current.prior_mac_key is not None:
        keys[checkpoint.pid if followed is None else followed] = current.prior_mac_key
    if checkpoint.mac_key:
        keys[checkpoint.pid] = checkpoint.mac_key
    if current.mac_key is not None:
        keys[current.pid] = current.mac_key
    return keys


#: An entry lifetime no scan reaches (its records span minutes, not centuries).
_NEVER = 2**62


def scan_state(
    checkpoint: ProducerCheckpoint,
    successor: int,
    verifier: CertVerifier | None = None,
    followed: int | None = None,
    resolve_gaps: bool = True,
    macs: Mapping[int, bytes] | None = None,
    late_ms: int = 0,
) -> ScanState:
    """The state a resume's scan starts from: the checkpoint's pid appended below its next seqs
    and below its ``ahead`` targets; the pids followed are the checkpoint's, ``successor`` (the
    one the resume continues) and ``followed`` (a successor of the checkpoint's pid that the
    resume found ended and rolled past).

    ``ahead`` is what an earlier scan saw appended, possibly before this scan's start
    (``taken_ms``); without it the first record after those would look held behind a gap, and
    this resumer's own FENCE would then "fence" it, although the rules appended it (DESIGN §9).
    A record of the checkpoint's generation stamped more than ``late_ms`` after its lease end is
    not counted: no lease is renewed, so none of the pid's own records is stamped that late
    (``late_ms`` covers the clock skew and librdkafka's message timeout, where the broker stamps
    a record when it lands), and a sink whose entry expired (``late_ms`` covers its timestamp
    skew) refuses such a copy.
    """
    known = dict(checkpoint.next_seq)
    for tp, target in checkpoint.ahead.items():
        known[tp] = max(known.get(tp, 0), target)
    base = {checkpoint.pid: {tp: n - 1 for tp, n in known.items()}}
    pids = {checkpoint.pid, successor} | ({followed} if followed is not None else set())
    return ScanState(
        pids,
        base,
        {checkpoint.pid: checkpoint.generation},
        5,
        verifier,
        resolve_gaps,
        macs,
        checkpoint.fenced,
        {checkpoint.pid: checkpoint.ahead_holes},
        {checkpoint.pid: (checkpoint.generation, checkpoint.expire_ms + late_ms)},
    )


def apply_scan(
    seq: Sequencer,
    checkpoint: ProducerCheckpoint,
    highs: Highs,
    followed: int | None = None,
    holes: Holes | None = None,
) -> None:
    """Set what ``seq`` (just resumed from ``checkpoint``) re-sends and skips after a scan.

    * Continuing the checkpoint's own pid: ``ahead`` = the next seq after the highest one in
      Kafka (re-sent records below it are DUPLICATEs; a rollover before reaching it hands the
      rest over as skips).
    * Continuing another pid (rolled, followed, fresh): the checkpoint's pid's records after the
      checkpoint are in Kafka already, so the successor skips them (plus the checkpoint's own
      skips); a followed successor's own records from its earlier holder set ``ahead``; those
      of a ``followed`` successor rolled past (its lease had ended) are skipped as well: its
      seqs started at 0 right after the checkpoint's pid's records.

    Seqs the sink skipped as a gap (``holes``: a timeout hole) are in no output: re-sent under
    the same pid they fill it (``ahead_holes`` keeps them for a later handover); after a roll
    they are sent, not skipped.
    """
    holes = holes or {}
    # What the checkpoint already knew was ahead of it (an earlier scan, possibly of records older
    # than this scan's start) counts as well.
    reach = {tp: h + 1 for tp, h in highs.get(checkpoint.pid, {}).items()}
    for tp, target in checkpoint.ahead.items():
        reach[tp] = max(reach.get(tp, 0), target)
    base = checkpoint.next_seq
    own = holes.get(checkpoint.pid, {})
    if seq.pid == checkpoint.pid:
        seq.ahead = {tp: n for tp, n in reach.items() if n > base.get(tp, 0)}
        seq.ahead_holes = {
            tp: [(max(a, base.get(tp, 0)), b) for a, b in own.get(tp, ()) if b >= base.get(tp, 0)]
            for tp in seq.ahead
            if own.get(tp)
        }
        return
    past = followed is not None and followed != seq.pid
    rolled_past = highs.get(followed, {}) if past and followed is not None else {}
    for tp in set(reach) | set(checkpoint.skip) | set(rolled_past):
        runs: SkipPlan = [(checkpoint.skip.get(tp, 0), list(checkpoint.resend.get(tp, ())))]
        if reach.get(tp, 0) > base.get(tp, 0):
            runs = after_pid(runs, base.get(tp, 0), reach[tp], own.get(tp, ()))
        if tp in rolled_past and followed is not None:
            runs = after_pid(runs, 0, rolled_past[tp] + 1, holes.get(followed, {}).get(tp, ()))
        for n, sends in runs:
            seq.with_skip({tp: n}, {tp: sends})
    seq.ahead = {tp: h + 1 for tp, h in highs.get(seq.pid, {}).items()}
    seq.ahead_holes = {tp: list(r) for tp, r in holes.get(seq.pid, {}).items() if r}


def after_pid(runs: SkipPlan, low: int, end: int, gaps: Iterable[tuple[int, int]]) -> SkipPlan:
    """The skip runs of one partition once a pid that ran ``runs`` from its seq ``low`` got
    ``low..end-1`` into Kafka (``gaps``: the seqs among them the sink skipped). That pid sent
    the runs' resend positions first, in order, then what came after them: those it
    delivered are skipped now, and a last run skips what it sent after them, but for its gaps
    (the sink has nothing of those)."""
    holes = list(gaps)
    seq = low
    kept_runs: SkipPlan = []
    for n, sends in runs:
        kept: list[int] = []
        for first, last in sends:
            for position in range(first, last - 1, -1):
                if seq >= end or any(a <= seq <= b for a, b in holes):
                    kept.append(position)
                seq += 1
        kept_runs.append((n, _as_ranges(kept)))
    kept_runs.append((max(end - seq, 0), sent_anyway(holes, seq, end)))
    return kept_runs


def _as_ranges(positions: list[int]) -> list[tuple[int, int]]:
    """Descending positions as ``(first, last)`` runs of consecutive ones."""
    out: list[tuple[int, int]] = []
    for position in positions:
        if out and out[-1][1] == position + 1:
            out[-1] = (out[-1][0], position)
        else:
            out.append((position, position))
    return out
