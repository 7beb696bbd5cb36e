"""Recovery scan: what the instance before a resume got into Kafka after its checkpoint.

A checkpoint is stored after a flush, but its owner goes on sending; when it dies (or is fenced),
the records it got acknowledged after the checkpoint are in Kafka under its pid. The resumer
re-sends them in the same order: under the same pid and seqs they are ``DUPLICATE`` and dropped,
but a resumer that rolls over before it re-sent all of them would send the rest under the
successor pid, where nothing deduplicates them (DESIGN §9). So a resume reads the raw partitions
once, from the checkpoint's time up to its own FENCE records, and learns the highest seq each
pid of the lineage reached per partition; the producer uses it to keep re-sending under the old
pid, or to skip those records after a rollover (``Sequencer.skip``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import confluent_kafka

from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.errors import BrokerUnavailable
from pidfence.producer.sequencer import Sequencer
from pidfence.wire import FLAG_FENCE, PF_HEADER_KEY, MalformedHeader, decode_pf
from pidfence.wire.cert import CERT_HEADER_KEY

log = logging.getLogger(__name__)

#: ``verifier(pid, generation, pfc, now_ms)``: None when ``pfc`` proves (pid, generation), else
#: why not (the broker rules' ``Verifier``).
CertVerifier = Callable[[int, int, "bytes | None", int], "str | None"]

#: pid -> (topic, partition) -> highest seq of a data record seen.
Highs = dict[int, dict[TopicPartition, int]]

#: Records produced this long before the checkpoint's clock are still scanned (clock skew).
SKEW_MS = 5_000


class Scanner(Protocol):
    """Reads the highest appended seq per (pid, partition) from the raw partitions."""

    def __call__(self, state: ScanState, partitions: Iterable[TopicPartition], since_ms: int,
                 until: Mapping[TopicPartition, int]) -> None:  # fmt: skip
        """Feed ``state`` the records of ``partitions`` from the first one at or after
        ``since_ms`` up to ``until`` (an exclusive end offset per partition: this resumer's
        FENCE record; partitions without one are read to their current end)."""


class KafkaScanner:
    """A :class:`Scanner` over a real Kafka cluster (one short-lived consumer per resume).

    Args:
        conf: librdkafka settings for the consumer (bootstrap and security settings).
        timeout_s: per metadata / offset request and for the whole scan.
        consumer_factory: builds the consumer (a fake in tests).
    """

    def __init__(
        self,
        conf: Mapping[str, Any],
        timeout_s: float = 30.0,
        consumer_factory: Callable[[dict[str, Any]], Any] = confluent_kafka.Consumer,
    ) -> None:
        self._conf = dict(conf)
        self._timeout_s = timeout_s
        self._factory = consumer_factory

    def __call__(
        self,
        state: ScanState,
        partitions: Iterable[TopicPartition],
        since_ms: int,
        until: Mapping[TopicPartition, int],
    ) -> None:
        """See :class:`Scanner`.

        Raises:
            BrokerUnavailable: Kafka did not answer within the timeout (retriable).
        """
        consumer = self._factory(
            {
                **self._conf,
                "group.id": "pidfence-recovery",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "logger": logging.getLogger("pidfence.producer.librdkafka"),
            }
        )
        try:
            self._scan(consumer, list(partitions), since_ms, until, state)
        except confluent_kafka.KafkaException as exc:
            raise BrokerUnavailable(
                f"the resume's recovery scan could not read Kafka ({exc}); resume again"
            ) from exc
        finally:
            consumer.close()

    def _scan(
        self,
        consumer: Any,
        partitions: list[TopicPartition],
        since_ms: int,
        until: Mapping[TopicPartition, int],
        state: ScanState,
    ) -> None:
        wanted = [confluent_kafka.TopicPartition(t, p, since_ms) for t, p in partitions]
        starts = consumer.offsets_for_times(wanted, timeout=self._timeout_s)
        ends: dict[TopicPartition, int] = {}
        assign = []
        for start in starts:
            tp = (start.topic, start.partition)
            end = until.get(tp)
            if end is None:
                _, end = consumer.get_watermark_offsets(
                    confluent_kafka.TopicPartition(*tp), timeout=self._timeout_s
                )
            if start.offset < 0 or start.offset >= end:
                continue  # nothing written since the checkpoint
            ends[tp] = end
            assign.append(
                confluent_kafka.TopicPartition(start.topic, start.partition, start.offset)
            )
        if not assign:
            return
        consumer.assign(assign)
        open_parts = set(ends)
        idle = 0
        while open_parts:
            msg = consumer.poll(1.0)
            if msg is None:
                idle += 1
                if idle > self._timeout_s:
                    raise BrokerUnavailable(
                        f"the recovery scan read nothing for {self._timeout_s}s; resume again"
                    )
                continue
            idle = 0
            tp = (msg.topic(), msg.partition())
            if msg.error() is not None:
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    open_parts.discard(tp)
                    continue
                raise confluent_kafka.KafkaException(msg.error())
            if tp not in open_parts:
                continue
            if msg.offset() >= ends[tp]:
                open_parts.discard(tp)
                continue
            state.note(tp, msg.headers(), msg.timestamp()[1])
            if msg.offset() + 1 >= ends[tp]:
                open_parts.discard(tp)


class ScanState:
    """Per (pid, partition): the highest seq the broker rules would append, from raw records.

    Records are fed in offset order per partition and judged the way the rules judge them
    (DESIGN §4), for the scanned pids only: a record below the newest generation seen is
    ``FENCED``; a record after a gap is held (up to ``window`` seqs ahead) and lands only when
    the gap closes, and a held record is fenced by a newer generation arriving first. So a
    record counts only if the rules append it: its event must otherwise still be re-sent.

    Args:
        pids: the pids to follow.
        base: per pid and partition, the highest seq known to be appended before the scan
            starts (a checkpoint's ``next_seq - 1``); -1 where unknown.
        generations: per pid, the generation the rules already hold on every partition when
            the scan starts (a checkpoint's: it is taken after the resume's FENCEs landed).
        window: the rules' reorder window.
    """

    def __init__(
        self,
        pids: set[int],
        base: Mapping[int, Mapping[TopicPartition, int]] | None = None,
        generations: Mapping[int, int] | None = None,
        window: int = 5,
        verifier: CertVerifier | None = None,
    ) -> None:
        self.pids = pids
        self._verifier = verifier
        self.highs: Highs = {pid: dict((base or {}).get(pid, {})) for pid in pids}
        self._base_gen = dict(generations or {})
        self._window = window
        self._gens: dict[tuple[int, TopicPartition], int] = {}
        self._held: dict[tuple[int, TopicPartition], dict[int, int]] = {}

    def note(
        self, tp: TopicPartition, headers: Iterable[tuple[str, Any]] | None, ts_ms: int = 0
    ) -> None:
        """Feed one raw record of ``tp`` (its headers and timestamp), in offset order."""
        pf_value: Any = None
        cert: bytes | None = None
        for key, value in headers or ():
            if key == PF_HEADER_KEY and pf_value is None:
                pf_value = value
            elif key == CERT_HEADER_KEY and cert is None:
                cert = value
        if pf_value is None:
            return
        try:
            pf = decode_pf(pf_value)
        except MalformedHeader:
            return
        if pf.pid in self.pids:
            fence = bool(pf.flags & FLAG_FENCE)
            self._judge(pf.pid, tp, pf.generation, pf.seq, fence, cert, ts_ms)

    def _judge(
        self,
        pid: int,
        tp: TopicPartition,
        generation: int,
        seq: int,
        fence: bool,
        cert: bytes | None = None,
        ts_ms: int = 0,
    ) -> None:
        ident = (pid, tp)
        newest = self._gens.get(ident, self._base_gen.get(pid, generation))
        if generation < newest:
            return  # FENCED
        held = self._held.setdefault(ident, {})
        creates = ident not in self._gens and pid not in self._base_gen
        if self._verifier is not None and (generation > newest or creates):
            # A verifying sink refuses a move or a new entry without a valid pfc (FORGED, no
            # state change): a forged FENCE must not fence this pid's later records here either.
            proven = any(g == generation for g in held.values())
            if not proven and self._verifier(pid, generation, cert, ts_ms) is not None:
                return
        self._gens[ident] = generation
        if generation > newest:
            # A newer generation fences every record still held under an older one.
            for s in [s for s, g in held.items() if g < generation]:
                del held[s]
        if fence:
            return
        per = self.highs[pid]
        high = per.get(tp, -1)
        if seq <= high:
            return  # DUPLICATE
        if seq > high + 1:
            if seq - high - 1 <= self._window:
                held[seq] = generation
            return
        high = seq
        while high + 1 in held:
            del held[high + 1]
            high += 1
        per[tp] = high


def consumer_conf(producer_conf: Mapping[str, Any]) -> dict[str, Any]:
    """The consumer settings a producer's librdkafka settings imply (bootstrap, security)."""
    keep = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.")
    return {k: v for k, v in producer_conf.items() if k.startswith(keep)}


def scan_state(
    checkpoint: ProducerCheckpoint, successor: int, verifier: CertVerifier | None = None
) -> ScanState:
    """The state a resume's scan starts from: the checkpoint's pid appended below its next seqs
    and below its ``ahead`` targets.

    ``ahead`` is what an earlier scan saw appended, possibly before this scan's start
    (``taken_ms``); without it the first record after those would look held behind a gap, and
    this resumer's own FENCE would then "fence" it, although the rules appended it (DESIGN §9).
    """
    known = dict(checkpoint.next_seq)
    for tp, target in checkpoint.ahead.items():
        known[tp] = max(known.get(tp, 0), target)
    base = {checkpoint.pid: {tp: n - 1 for tp, n in known.items()}}
    return ScanState(
        {checkpoint.pid, successor}, base, {checkpoint.pid: checkpoint.generation}, 5, verifier
    )


def apply_scan(seq: Sequencer, checkpoint: ProducerCheckpoint, highs: Highs) -> None:
    """Set what ``seq`` (just resumed from ``checkpoint``) re-sends and skips after a scan.

    * Continuing the checkpoint's own pid: ``ahead`` = the next seq after the highest one in
      Kafka (re-sent records below it are DUPLICATEs; a rollover before reaching it hands the
      rest over as skips).
    * Continuing another pid (rolled, followed, fresh): the checkpoint's pid's records after the
      checkpoint are in Kafka already, so the successor skips them (plus the checkpoint's own
      skips); a followed successor's own records from its earlier holder set ``ahead``.
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
    seq.with_skip(checkpoint.skip).with_skip(extra)
    seq.ahead = {tp: h + 1 for tp, h in highs.get(seq.pid, {}).items()}
