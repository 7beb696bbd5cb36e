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
from pidfence.wire import CERT_HEADER_KEY, MAC_HEADER_KEY, PF_HEADER_KEY, MalformedHeader, decode_pf
from pidfence.wire.mac import mac_matches, record_hasher, record_mac_from

#: ``verifier(topic, partition)``: the broker rules' verifier of that partition (what the sink's
#: ``leasePublicKey`` makes: :meth:`pidfence.wire.statement.PlacedCheck.for_partition`).
CertVerifier = Callable[[str, int], Verifier]

#: pid -> (topic, partition) -> highest seq of a data record seen.
Highs = dict[int, dict[TopicPartition, int]]


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
    ) -> None:
        self.pids = pids
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
                    table, pf.pid, pf.generation, pf.seq, pf.flags, cert, ts_ms
                ):
                    return
                self._unsure.discard((pf.pid, tp))
            table.offer(pf.pid, pf.generation, pf.seq, ts_ms, pf.flags, cert=cert)
            table.forged.clear()
            table.gaps.clear()

    def _first_proven(
        self,
        table: ProducerStateTable,
        pid: int,
        g: int,
        seq: int,
        flags: int,
        cert: bytes | None,
        ts_ms: int,
    ) -> bool:
        """Whether the first record of ``pid`` on an unsure partition counts: with a verifier,
        a record of the checkpoint's generation must prove itself, as it must at a sink that
        holds no entry there (an older generation is still judged, and FENCED, by the table)."""
        verify = table.verifier
        if verify is None or g != self._base_gen.get(pid):
            return True
        return verify(pid, g, seq, flags, cert, max(table.clock, ts_ms)) is None


def handover(current: Sequencer) -> dict[TopicPartition, int]:
    """What the successor of ``current`` must skip: ``current``'s unsent skips, plus the
    records an earlier instance of its pid got into Kafka that it has not re-sent yet (the
    recovery scan's ``ahead``): the successor's seqs would not deduplicate them."""
    out = dict(current.skip)
    for tp, target in current.ahead.items():
        behind = target - current.peek(*tp)
        if behind > 0:
            out[tp] = out.get(tp, 0) + behind
    return out


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
) -> ScanState:
    """The state a resume's scan starts from: the checkpoint's pid appended below its next seqs
    and below its ``ahead`` targets; the pids followed are the checkpoint's, ``successor`` (the
    one the resume continues) and ``followed`` (a successor of the checkpoint's pid that the
    resume found ended and rolled past).

    ``ahead`` is what an earlier scan saw appended, possibly before this scan's start
    (``taken_ms``); without it the first record after those would look held behind a gap, and
    this resumer's own FENCE would then "fence" it, although the rules appended it (DESIGN §9).
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
    )


def apply_scan(
    seq: Sequencer, checkpoint: ProducerCheckpoint, highs: Highs, followed: int | None = None
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
    """
    # What the checkpoint already knew was ahead of it (an earlier scan, possibly of records older
    # than this scan's start) counts as well.
    reach = {tp: h + 1 for tp, h in highs.get(checkpoint.pid, {}).items()}
    for tp, target in checkpoint.ahead.items():
        reach[tp] = max(reach.get(tp, 0), target)
    base = checkpoint.next_seq
    if seq.pid == checkpoint.pid:
        seq.ahead = {tp: n for tp, n in reach.items() if n > base.get(tp, 0)}
        return
    extra = {tp: n - base.get(tp, 0) for tp, n in reach.items()}
    if followed is not None and followed != seq.pid:
        for tp, high in highs.get(followed, {}).items():
            extra[tp] = extra.get(tp, 0) + high + 1
    seq.with_skip(checkpoint.skip).with_skip(extra)
    seq.ahead = {tp: h + 1 for tp, h in highs.get(seq.pid, {}).items()}
