"""``ProducerCheckpoint``: what a caller stores atomically with its upstream position."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pidfence.producer.errors import BadCheckpoint

T = TypeVar("T")

TopicPartition = tuple[str, int]

#: Version 3 carries sticky positions of unkeyed records (``sticky``), version 2 a skip plan
#: with holes (``resend``, ``ahead_holes``); a checkpoint with neither is written as version 1,
#: which every pidfence reads. An older pidfence refuses a newer version rather than skip a
#: hole's events (it would read the skips as a plain count) or replay unkeyed records to other
#: partitions than the first run (other seqs: duplicates and losses).
CHECKPOINT_VERSION = 3
_HOLES_VERSION = 2
_PLAIN_VERSION = 1


@dataclass(frozen=True, slots=True)
class ProducerCheckpoint:
    """A producer's identity and its next sequence number per (topic, partition).

    Take it after :meth:`IdempotentProducer.flush`, so every seq below ``next_seq`` is acknowledged.

    Attributes:
        pid: the leased producer id.
        generation: the generation the records were sent under.
        expire_ms: the lease end (epoch ms); a checkpoint past it is resumed under a new pid.
        next_seq: next seq per (topic, partition) the producer has written to.
        lifetime_ms: the lease lifetime when known (0: unknown), to time the rollover on resume.
        secret: the pid's capability from the lease server; ``bump`` and ``roll`` require it
            (stored as hex; the file holding a checkpoint is written with mode 0600).
        mac_key: the pid's record MAC key in the per-record mode (empty: none), stored like
            ``secret``: a resume's recovery scan checks the records written after the
            checkpoint with it, so an injected record never counts as one of its own.
        fenced: the partitions a resume FENCEd, with the generation of that FENCE: there the
            sink holds an entry for the pid, so the recovery scan need not ask the first record
            after the checkpoint to prove itself with a certificate.
        resend: per partition, the records of the ``skip`` run sent after all, as ``(first,
            last)`` positions counted back from the run's end: the predecessor's seqs the sink
            skipped as a gap (:attr:`pidfence.producer.sequencer.Sequencer.resend`).
        ahead_holes: per partition, the seqs below ``ahead`` the sink skipped as a gap,
            ``(first, last)`` ascending: never to be skipped by a successor.
        sticky: per topic, where unkeyed records without a partition go next: ``(partition,
            records left)`` before moving on (:class:`~pidfence.producer.partitioner.
            Partitioner`). Empty (an older checkpoint): each topic starts afresh.
        sticky_seed: a topic's first unkeyed record goes to ``sticky_seed % partitions``; 0:
            the checkpoint's ``pid`` (written only when it differs: after a rollover).
    """

    pid: int
    generation: int
    expire_ms: int
    next_seq: Mapping[TopicPartition, int] = field(default_factory=dict)
    lifetime_ms: int = 0
    secret: bytes = field(default=b"", repr=False)
    skip: Mapping[TopicPartition, int] = field(default_factory=dict)
    taken_ms: int = 0
    ahead: Mapping[TopicPartition, int] = field(default_factory=dict)
    topics: tuple[str, ...] = ()
    mac_key: bytes = field(default=b"", repr=False)
    fenced: Mapping[TopicPartition, int] = field(default_factory=dict)
    resend: Mapping[TopicPartition, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    ahead_holes: Mapping[TopicPartition, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    sticky: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    sticky_seed: int = 0

    @property
    def version(self) -> int:
        """The oldest checkpoint version that holds everything this one carries."""
        if self.sticky:
            return CHECKPOINT_VERSION
        return _HOLES_VERSION if self.resend or self.ahead_holes else _PLAIN_VERSION

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``next_seq`` as ``[[topic, partition, seq], ...]``, sorted)."""
        seed = self.sticky_seed if self.sticky_seed not in (0, self.pid) else 0
        return (
            {
                "v": self.version,
                "pid": self.pid,
                "generation": self.generation,
                "expire_ms": self.expire_ms,
                "lifetime_ms": self.lifetime_ms,
                "next_seq": [[t, p, s] for (t, p), s in sorted(self.next_seq.items())],
                "secret": self.secret.hex(),
                "skip": [[t, p, n] for (t, p), n in sorted(self.skip.items()) if n],
                "taken_ms": self.taken_ms,
                "ahead": [[t, p, n] for (t, p), n in sorted(self.ahead.items())],
                "topics": sorted(self.topics),
            }
            | ({"mac_key": self.mac_key.hex()} if self.mac_key else {})
            | (
                {"fenced": [[t, p, g] for (t, p), g in sorted(self.fenced.items())]}
                if self.fenced
                else {}
            )
            | _ranges_field("resend", self.resend)
            | _ranges_field("ahead_holes", self.ahead_holes)
            | (
                {"sticky": [[t, p, n] for t, (p, n) in sorted(self.sticky.items())]}
                if self.sticky
                else {}
            )
            | ({"sticky_seed": seed} if seed else {})
        )

    def to_json(self) -> str:
        """The checkpoint as one JSON document."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Any) -> ProducerCheckpoint:
        """Parse :meth:`to_dict` output.

        Raises:
            BadCheckpoint: wrong version, missing field or wrong types.
        """
        try:
            if data["v"] not in (_PLAIN_VERSION, _HOLES_VERSION, CHECKPOINT_VERSION):
                raise BadCheckpoint(
                    f"checkpoint version {data['v']!r} is not {_PLAIN_VERSION} to "
                    f"{CHECKPOINT_VERSION}: written by a newer pidfence? Resume it with that one"
                )
            next_seq = _per_partition(data["next_seq"], "next_seq")
            skip = _per_partition(data.get("skip", []), "skip")
            ahead = _per_partition(data.get("ahead", []), "ahead")
            fenced = _per_partition(data.get("fenced", []), "fenced")
            resend = _ranges_per_partition(data.get("resend", []), "resend", descending=True)
            ahead_holes = _ranges_per_partition(data.get("ahead_holes", []), "ahead_holes")
            for tp, ranges in resend.items():
                if ranges[0][0] > skip.get(tp, 0) or ranges[-1][1] < 1:
                    raise BadCheckpoint(f"resend positions {ranges!r} outside the skip run of {tp}")
            for tp, ranges in ahead_holes.items():
                if ranges[-1][1] >= ahead.get(tp, 0):
                    raise BadCheckpoint(f"ahead_holes {ranges!r} not below the ahead of {tp}")
            topics = data.get("topics", [])
            if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
                raise BadCheckpoint(f"topics must be a list of names, got {topics!r}")
            fields = {k: data[k] for k in ("pid", "generation", "expire_ms")}
            if any(type(v) is not int or v < 0 for v in fields.values()):
                raise BadCheckpoint(f"pid, generation and expire_ms must be ints >= 0: {fields}")
            lifetime_ms = _optional(data, "lifetime_ms", 0, "an int")
            taken_ms = _optional(data, "taken_ms", 0, "an int")
            secret = bytes.fromhex(_optional(data, "secret", "", "a hex string"))
            mac_key = bytes.fromhex(_optional(data, "mac_key", "", "a hex string"))
            sticky = _sticky(data.get("sticky", []))
            sticky_seed = _optional(data, "sticky_seed", 0, "an int")
            if sticky_seed < 0:
                raise BadCheckpoint(f"sticky_seed must be >= 0, got {sticky_seed}")
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, BadCheckpoint):
                raise
            raise BadCheckpoint(
                f"not a producer checkpoint ({exc!r}); restore a good copy"
            ) from exc
        return cls(
            next_seq=next_seq,
            lifetime_ms=lifetime_ms,
            secret=secret,
            skip=skip,
            taken_ms=taken_ms,
            ahead=ahead,
            topics=tuple(topics),
            mac_key=mac_key,
            fenced=fenced,
            resend=resend,
            ahead_holes=ahead_holes,
            sticky=sticky,
            sticky_seed=sticky_seed,
            **fields,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ProducerCheckpoint:
        """Parse :meth:`to_json` output.

        Raises:
            BadCheckpoint: not JSON, or not a checkpoint.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise BadCheckpoint(f"checkpoint is not JSON ({exc}); restore a good copy") from exc
        return cls.from_dict(data)


def _optional(data: Any, key: str, default: T, what: str) -> T:
    """``data[key]`` (``default`` when absent), of exactly the default's type (``what``)."""
    value = data.get(key, default)
    if type(value) is not type(default):
        raise BadCheckpoint(f"{key} must be {what}, got {value!r}")
    return value


def _per_partition(items: Any, name: str) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for topic, partition, n in items:
        if not isinstance(topic, str) or type(partition) is not int or type(n) is not int:
            raise BadCheckpoint(f"bad {name} entry {[topic, partition, n]!r}")
        if partition < 0 or n < 0:
            raise BadCheckpoint(f"negative partition or count in {name} {[topic, partition, n]!r}")
        out[(topic, partition)] = n
    return out


def _sticky(items: Any) -> dict[str, tuple[int, int]]:
    """Parse ``sticky`` rows ``[topic, partition, records left]``, one per topic."""
    rows = [((t, p), n) for (t, p), n in _per_partition(items, "sticky").items()]
    out = {t: (p, n) for (t, p), n in rows}
    if len(out) != len(items):
        raise BadCheckpoint(f"sticky names a topic twice: {items!r}")
    return out


def _ranges_field(
    name: str, ranges: Mapping[TopicPartition, tuple[tuple[int, int], ...]]
) -> dict[str, Any]:
    """``{name: [[topic, partition, [[a, b], ...]], ...]}``, or nothing when empty."""
    rows = [[t, p, [list(r) for r in rs]] for (t, p), rs in sorted(ranges.items()) if rs]
    return {name: rows} if rows else {}


def _ranges_per_partition(
    items: Any, name: str, descending: bool = False
) -> dict[TopicPartition, tuple[tuple[int, int], ...]]:
    """Parse :func:`_ranges_field` rows: non-negative ``[a, b]`` ranges in order (``a <= b``
    ascending; ``a >= b`` descending), disjoint."""
    out: dict[TopicPartition, tuple[tuple[int, int], ...]] = {}
    for topic, partition, ranges in items:
        if not isinstance(topic, str) or type(partition) is not int or partition < 0:
            raise BadCheckpoint(f"bad {name} entry {[topic, partition]!r}")
        pairs = [tuple(r) for r in ranges]
        flat = [v for pair in pairs for v in pair]
        if (
            not pairs
            or any(len(pair) != 2 for pair in pairs)
            or any(type(v) is not int or v < 0 for v in flat)
        ):
            raise BadCheckpoint(f"bad {name} ranges {ranges!r}")
        ordered = flat[::-1] if descending else flat
        if any(x > y for x, y in itertools.pairwise(ordered)) or any(
            x == y for x, y in zip(ordered[1::2], ordered[2::2], strict=False)
        ):
            raise BadCheckpoint(f"{name} ranges must be ordered and disjoint: {ranges!r}")
        out[(topic, partition)] = tuple((a, b) for a, b in pairs)
    return out
