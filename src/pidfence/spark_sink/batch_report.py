"""What a sink run committed, as ``pidfence sink`` reports it: a line per committed batch
(:class:`BatchLine`, found by :class:`BatchWatcher` from the batch's manifest and Spark's
progress) and the run's totals (:class:`SinkRunSummary`, :func:`summarise`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pidfence.spark_sink.manifest import BatchManifest
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.progress import BatchProgress, progress_by_batch


@dataclass
class SinkRunSummary:
    """What a run committed (from the manifests it published)."""

    batches: list[int] = field(default_factory=list)
    records_in: int = 0
    appended: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    #: ``FORGED`` records by reason (``missing``, ``unknown_key`` …).
    forged: dict[str, int] = field(default_factory=dict)
    #: Gaps reported, by kind (``lost``, ``head``, ``expired``, ``offsets``).
    gaps: dict[str, int] = field(default_factory=dict)

    def add_manifest(self, manifest: BatchManifest) -> None:
        """Account one committed batch."""
        self.batches.append(manifest.batch)
        for part in manifest.parts:
            for gap in part.gaps:
                self.gaps[gap.kind] = self.gaps.get(gap.kind, 0) + 1
            self.records_in += part.rows_in
            self.appended += part.appended
            for verdict, n in part.counts.items():
                if verdict not in ("APPENDED", "NON_IDEMPOTENT"):
                    self.dropped[verdict] = self.dropped.get(verdict, 0) + n
            for reason, n in part.forged.items():
                self.forged[reason] = self.forged.get(reason, 0) + n


def summarise(output: str, after: int = -1, epoch: int = 0) -> SinkRunSummary:
    """Summary of the batches committed with id > ``after`` (by the sink instance of ``epoch``
    only, unless it is 0)."""
    summary = SinkRunSummary()
    for manifest in Output.reading(output).manifests(after):
        if epoch in (0, manifest.epoch):
            summary.add_manifest(manifest)
    return summary


@dataclass(frozen=True)
class BatchLine:
    """One committed batch as ``pidfence sink`` prints it.

    Attributes:
        batch: the batch id.
        records_in: Kafka records the batch read.
        appended: records appended to the output log.
        dropped: records dropped, by verdict name.
        lag: the Kafka source's ``maxOffsetsBehindLatest`` after the batch (None if unknown).
        seconds: the batch's wall time (Spark's ``triggerExecution``; None if unknown).
        forged: ``FORGED`` records by reason (their total is ``dropped["FORGED"]``).
        gaps: gaps the batch reported, by kind.
    """

    batch: int
    records_in: int
    appended: int
    dropped: dict[str, int]
    lag: int | None
    seconds: float | None = None
    forged: dict[str, int] = field(default_factory=dict)
    gaps: dict[str, int] = field(default_factory=dict)

    def human(self) -> str:
        """``batch 12: 98,012 in → 97,500 appended, 518 dropped (DUPLICATE 500, FENCED 12,
        FORGED 6 (missing 2, unknown_key 4)), lag 3,400, 1.9 s``."""
        total = sum(self.dropped.values())
        parts = [f"batch {self.batch}: {self.records_in:,} in → {self.appended:,} appended"]
        by_verdict = ", ".join(
            f"{name} {n:,}{self._reasons() if name == 'FORGED' else ''}"
            for name, n in sorted(self.dropped.items(), key=lambda kv: (-kv[1], kv[0]))
            if n
        )
        parts.append(f"{total:,} dropped" + (f" ({by_verdict})" if by_verdict else ""))
        if self.gaps:
            n = sum(self.gaps.values())
            kinds = ", ".join(f"{kind} {k:,}" for kind, k in sorted(self.gaps.items()))
            parts.append(f"{n:,} gap{'s' if n != 1 else ''} ({kinds})")
        if self.lag is not None:
            parts.append(f"lag {self.lag:,}")
        if self.seconds is not None:
            parts.append(f"{self.seconds:.1f} s")
        return ", ".join(parts)

    def _reasons(self) -> str:
        reasons = ", ".join(f"{r} {n:,}" for r, n in sorted(self.forged.items()) if n)
        return f" ({reasons})" if reasons else ""


class BatchWatcher:
    """Reports each batch a running query commits, once, from its manifest and progress.

    Args:
        output: the sink's ``path``.
        after: report only batches with a larger id (the last committed one before the start).
        epoch: report only the batches the sink instance of this epoch committed (0: all).
    """

    def __init__(self, output: str, after: int = -1, epoch: int = 0) -> None:
        self.output = output
        self.last = after
        self.epoch = epoch

    def poll(self, query: Any, final: bool = False) -> list[BatchLine]:
        """Lines of the batches committed since the previous call, in batch order.

        A batch whose progress event (its lag) has not arrived yet waits for the next call,
        unless a later batch is already committed or ``final`` is set.
        """
        # Opened afresh: the owner is known once the query claimed the path. Batch ids are
        # consecutive up to the log table's transaction version: nothing is listed.
        output = Output.reading(self.output)
        new = list(range(self.last + 1, output.committed_version() + 1))
        if not new:
            return []
        progress = progress_by_batch(query)
        lines = []
        for bid in new:
            if bid not in progress and bid == new[-1] and not final:
                break
            manifest = output.committed(bid)
            if manifest is None:
                break
            self.last = bid
            if self.epoch not in (0, manifest.epoch):
                continue  # committed by another instance of the sink
            one = SinkRunSummary()
            one.add_manifest(manifest)
            seen = progress.get(bid, BatchProgress())
            lines.append(
                BatchLine(
                    bid,
                    one.records_in,
                    one.appended,
                    one.dropped,
                    seen.lag,
                    seen.seconds,
                    one.forged,
                    one.gaps,
                )
            )
        return lines


__all__ = ["BatchLine", "BatchWatcher", "SinkRunSummary", "summarise"]
