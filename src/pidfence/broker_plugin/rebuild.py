"""Re-deriving a partition's state from a snapshot and the log after it."""

from __future__ import annotations

from collections.abc import Iterable

from pidfence.broker_plugin.table import ProducerStateTable


def rebuild(
    snapshot: bytes | None,
    records: Iterable[tuple[bytes | None, int]],
    *,
    capacity: int | None = None,
    lifetime_ms: int | None = None,
    reorder_window: int | None = None,
    grace_ms: int | None = None,
) -> ProducerStateTable:
    """State after replaying ``records`` (``(pf header bytes or None, ts_ms)``, log order).

    Args:
        snapshot: bytes from :meth:`ProducerStateTable.snapshot`, or ``None`` to start empty
            (then ``capacity`` and ``lifetime_ms`` are required).
        records: the log suffix after the snapshot: appended records and ``FENCE`` records, in the
            order they were decided.

    Raises:
        CorruptSnapshot: the snapshot is damaged (fall back to an older one or a full replay).
    """
    if snapshot is None:
        if capacity is None or lifetime_ms is None:
            raise ValueError("rebuild without a snapshot needs capacity and lifetime_ms")
        table = ProducerStateTable(
            capacity,
            lifetime_ms,
            5 if reorder_window is None else reorder_window,
            0 if grace_ms is None else grace_ms,
        )
    else:
        table = ProducerStateTable.restore(
            snapshot,
            capacity=capacity,
            lifetime_ms=lifetime_ms,
            reorder_window=reorder_window,
            grace_ms=grace_ms,
        )
    for header, ts_ms in records:
        table.offer_header(header, ts_ms)
    return table
