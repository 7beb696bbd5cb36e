"""The manifest of one committed batch: what each partition's task wrote, as one typed value.

The writer builds it from the tasks' :class:`PartCommit` messages and the driver stores it (JSON,
:meth:`BatchManifest.encode`); state recovery, the readers, the per-batch report, the metrics and
``pidfence verify`` read it back with :meth:`BatchManifest.decode`. Nothing else spells its keys.
Each manifest also carries the :class:`Totals` of every committed batch up to its own, so the
newest one alone tells what the output holds.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Final

from pidfence.spark_sink.errors import ManifestUnreadable
from pidfence.spark_sink.gaps import GapReport
from pidfence.wire.authority import PidStatus

#: The kinds of file a part may have: its appended rows, rejects, records held for reordering at
#: the end of the batch, and its decisions (:mod:`~pidfence.spark_sink.decisions`).
KINDS: Final = ("log", "rejects", "held", "decided")


def part_name(topic: str, partition: int) -> str:
    """File-name form of a (topic, partition): ``~`` cannot occur in a Kafka topic name."""
    return f"{topic}~{partition}"


@dataclass(frozen=True, slots=True)
class PartFiles:
    """The files one task attempt staged for one partition, by kind (relative to their root;
    None: the part has none of that kind), and the Delta ``stats`` JSON of its ``log`` and
    ``rejects`` files, taken from the rows as they were written."""

    log: str | None = None
    rejects: str | None = None
    held: str | None = None
    decided: str | None = None
    stats: Mapping[str, str] = field(default_factory=dict)

    def of(self, kind: str) -> str | None:
        """The file of ``kind`` (one of :data:`KINDS`)."""
        path: str | None = getattr(self, kind)
        return path

    def named(self) -> set[str]:
        """Every file named (relative paths)."""
        return {path for kind in KINDS if (path := self.of(kind)) is not None}


@dataclass(frozen=True)
class PartCommit:
    """What one task wrote for one (topic, partition) of a batch: one part of its manifest.

    Attributes:
        rows_in: Kafka records read; ``appended``, ``rejected`` and ``held`` what became of them.
        log_start, log_end: the ``log_offset`` range the part appended (end exclusive).
        kafka_first, kafka_last: the Kafka offsets read.
        counts: records by verdict; ``forged``: ``FORGED`` records by reason.
        flushed: the reorder window was closed at the end of the batch (a replay does the same).
        state: the state file the task wrote; ``tag``: its attempt's tag (its files carry it).
        prev: the previous committed batch that read this partition (None: none).
        gaps: the gaps the part reported; ``horizon_ms``: the adoption horizon it opened.
        producers: live producer entries of the partition after the batch.
        state_bytes: bytes of the partition's state chain after the batch (the full snapshot
            and the deltas a restart loads).
        answers: the lease servers' answers of the batch, pid (as text) to ``PidStatus`` list
            (None: it ran without them); ``rules``: the rules' settings it ran under. A replay
            decides with both, as the live run did.
    """

    topic: str
    partition: int
    rows_in: int
    appended: int
    rejected: int
    log_start: int
    log_end: int
    kafka_first: int
    kafka_last: int
    counts: Mapping[str, int]
    state: str
    tag: str
    files: PartFiles = PartFiles()
    held: int = 0
    flushed: bool = False
    forged: Mapping[str, int] = field(default_factory=dict)
    prev: int | None = None
    gaps: tuple[GapReport, ...] = ()
    horizon_ms: int | None = None
    producers: int = 0
    state_bytes: int = 0
    answers: Mapping[str, list[Any]] | None = None
    rules: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """``TOPIC~PARTITION``."""
        return part_name(self.topic, self.partition)

    def to_dict(self) -> dict[str, Any]:
        """As stored in the manifest."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        files = self.files
        data["files"] = {**{k: files.of(k) for k in KINDS}, "stats": dict(files.stats)}
        data["counts"], data["forged"] = dict(sorted(self.counts.items())), dict(self.forged)
        data["gaps"] = [asdict(gap) for gap in self.gaps]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PartCommit:
        """A stored part back (its recorded answers checked: a damaged one is a damaged
        manifest, not a failure of the rebuild that replays it)."""
        files = dict(data["files"])
        for pid, row in (data.get("answers") or {}).items():
            int(pid)
            PidStatus.from_list(row)
        return cls(
            **{
                **data,
                "files": PartFiles(**{**files, "stats": dict(files.get("stats") or {})}),
                "gaps": tuple(GapReport(**gap) for gap in data["gaps"]),
            }
        )


@dataclass(frozen=True)
class Totals:
    """What an output's committed batches add up to, as of one batch.

    Attributes:
        batches: batches committed.
        records_in: Kafka records they read; ``appended``: records in the log.
        counts: records by final verdict (``APPENDED`` and ``NON_IDEMPOTENT`` included).
        gaps: gaps reported, by kind (``offsets``, ``lost``, ``head``, ``filled`` ...).
        committed_ms: when the newest of the batches was committed (ms since the epoch).
    """

    batches: int = 0
    records_in: int = 0
    appended: int = 0
    counts: Mapping[str, int] = field(default_factory=dict)
    gaps: Mapping[str, int] = field(default_factory=dict)
    committed_ms: int = 0

    def plus(self, parts: tuple[PartCommit, ...], committed_ms: int) -> Totals:
        """These totals and one more batch of ``parts``, committed at ``committed_ms``."""
        counts, gaps = Counter(self.counts), Counter(self.gaps)
        for part in parts:
            counts.update(part.counts)
            gaps.update(gap.kind for gap in part.gaps)
        return Totals(
            self.batches + 1,
            self.records_in + sum(p.rows_in for p in parts),
            self.appended + sum(p.appended for p in parts),
            dict(sorted(counts.items())),
            dict(sorted(gaps.items())),
            committed_ms,
        )


@dataclass(frozen=True)
class BatchManifest:
    """One committed batch: its id, the streaming query that committed it, its parts in
    (topic, partition) order, the output's totals including it, and the epoch of the sink
    instance that wrote it (0: unfenced)."""

    VERSION: ClassVar[int] = 5

    batch: int
    query: str
    parts: tuple[PartCommit, ...]
    totals: Totals = Totals()
    epoch: int = 0

    def part(self, topic: str, partition: int) -> PartCommit | None:
        """The part of (topic, partition), if the batch read it."""
        return next((p for p in self.parts if (p.topic, p.partition) == (topic, partition)), None)

    def named(self) -> set[str]:
        """Every file its parts name (relative paths)."""
        return {name for part in self.parts for name in part.files.named()}

    def figures(self) -> dict[str, Any]:
        """The batch's own figures, as each of its Delta commits' info carries them (beside
        Spark's ``queryId`` and ``epochId``): what a Python data source cannot put in Spark's
        ``StreamingQueryProgress``."""
        one = Totals().plus(self.parts, 0)
        return {
            "parts": len(self.parts),
            "rows_in": one.records_in,
            "appended": one.appended,
            "verdicts": dict(one.counts),
            "gaps": dict(one.gaps),
        }

    def encode(self) -> bytes:
        """The stored form (JSON)."""
        body = {
            "version": self.VERSION,
            "batch": self.batch,
            "query": self.query,
            "epoch": self.epoch,
            "parts": [p.to_dict() for p in self.parts],
            "totals": asdict(self.totals),
        }
        return json.dumps(body, sort_keys=True, indent=1).encode()

    @classmethod
    def decode(cls, data: bytes) -> BatchManifest:
        """A stored manifest back.

        Raises:
            ManifestUnreadable: not a manifest of this version, or damaged.
        """
        try:
            body = json.loads(data)
            version = body.get("version")
            if version != cls.VERSION:
                raise ManifestUnreadable(
                    f"a batch manifest of format {version!r}; this pidfence reads format "
                    f"{cls.VERSION}: run the pidfence version that wrote the output, or give "
                    "this one a new --output and --checkpoint"
                )
            parts = tuple(PartCommit.from_dict(p) for p in body["parts"])
            totals = Totals(**body["totals"])
            return cls(int(body["batch"]), str(body["query"]), parts, totals, int(body["epoch"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ManifestUnreadable(f"a damaged batch manifest: {exc!r}") from exc


@dataclass(frozen=True)
class Position:
    """Where a partition stands: the newest committed batch that read it, and its part there."""

    batch: int
    part: PartCommit


def encode_positions(batch: int, positions: Mapping[str, Position]) -> bytes:
    """The positions index as of ``batch`` (partition name to position), stored form."""
    parts = {name: {"batch": p.batch, "part": p.part.to_dict()} for name, p in positions.items()}
    return json.dumps({"batch": batch, "parts": parts}, sort_keys=True).encode()


def decode_positions(data: bytes) -> dict[str, Position]:
    """A stored positions index back.

    Raises:
        ManifestUnreadable: damaged, or of another version.
    """
    try:
        parts = json.loads(data)["parts"]
        return {
            name: Position(int(p["batch"]), PartCommit.from_dict(p["part"]))
            for name, p in parts.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestUnreadable(f"a damaged positions index: {exc!r}") from exc


__all__ = [
    "KINDS",
    "BatchManifest",
    "PartCommit",
    "PartFiles",
    "Position",
    "Totals",
    "decode_positions",
    "encode_positions",
    "part_name",
]
