"""One partition's batch through the broker rules: Kafka rows in, log rows and rejects out.

Computation on Arrow tables (no Spark; no I/O but the injected gap authority's questions to
the lease servers), so it is unit-tested directly. Besides the
log and the rejects, a batch commits the records still held for reordering at its end (``held``),
so the committed output alone determines the partition's state (DESIGN §4 amended). Rejects and
held records keep their raw ``pf`` header in an extra ``pf`` column for exact replays. What a
batch's decisions depended on besides its records is committed with it too: the horizon it opened,
the lease servers' answers it got (``answers``) and the rules' settings it ran under (``rules``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pidfence.broker_plugin import (
    CODE_OF,
    VERDICT_CODES,
    BatchResult,
    ProducerStateTable,
    rules_of,
)
from pidfence.broker_plugin.decode import decode_headers
from pidfence.spark_sink.authority import BatchAuthority
from pidfence.spark_sink.gaps import GapReport, seq_gaps, unread_offsets
from pidfence.spark_sink.record_macs import mac_forged
from pidfence.spark_sink.schema import HEADERS_TYPE, HELD_SCHEMA, LOG_SCHEMA, TS_TYPE
from pidfence.spark_sink.state import HeldRow, PartitionState
from pidfence.wire import (
    CERT_HEADER_KEY,
    MAC_HEADER_KEY,
    PF_HEADER_KEY,
    RecordMacCheck,
    Verdict,
)

_BUFFERED: Final = CODE_OF[Verdict.BUFFERED]
#: Per verdict code: does a record with it go to the rejects (not appended, not held)?
_DROPPED: Final = np.ones(256, dtype=bool)
_DROPPED[[CODE_OF[Verdict.APPENDED], CODE_OF[Verdict.NON_IDEMPOTENT], _BUFFERED]] = False
_NON_IDEMPOTENT: Final = CODE_OF[Verdict.NON_IDEMPOTENT]
_NAMES: Final = np.array([v.name for v in VERDICT_CODES], dtype=object)
_LOG_OFFSET: Final = LOG_SCHEMA.get_field_index("log_offset")


@dataclass
class PartitionOutput:
    """What one batch of one partition produced.

    ``held`` is every record still held for reordering at the end of the batch (committed with
    it); ``forged`` counts ``FORGED`` verdicts by reason; ``flushed`` says the reorder window was
    closed at the end of the batch (a replay does the same); ``gaps`` are the gaps the batch
    found; ``horizon_ms`` is set when the batch opened an adoption horizon (a replay opens it
    again); ``answers`` are what the lease servers answered (None: the batch ran without them)
    and ``rules`` the settings it ran under (a replay takes both).
    """

    log: pa.Table
    rejects: pa.Table
    held: pa.Table
    rows_in: int
    counts: dict[str, int]
    forged: dict[str, int]
    flushed: bool
    gaps: list[GapReport]
    horizon_ms: int | None = None
    answers: dict[str, list[Any]] | None = None
    rules: dict[str, Any] | None = None


def header_values(
    headers: pa.Array | pa.ChunkedArray, key: str = PF_HEADER_KEY, present_null: bytes | None = None
) -> pa.Array:
    """The first value of header ``key`` per row of a Kafka ``headers`` column (null if absent).

    Args:
        headers: the Kafka source's ``headers`` column.
        key: the header key.
        present_null: what a header that is present with a null value becomes (None keeps the
            null). A ``pf`` header with a null value is not "no header": it is ``MALFORMED``.
    """
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    n = len(headers)
    flat = pc.list_flatten(headers)
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    keys = flat.field("key")
    hit = pc.fill_null(pc.equal(keys, key), False).to_numpy(zero_copy_only=False)
    rows = parents[hit]
    positions = np.flatnonzero(hit)
    # Parent indices ascend, so a row's first hit is where the row number changes.
    first = np.ones(len(rows), dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    index = np.full(n, -1, dtype=np.int64)
    index[rows[first]] = positions[first]
    values = flat.field("value")
    if present_null is not None and len(values) and values.null_count:
        values = pc.fill_null(values, pa.scalar(present_null, pa.binary()))
    mask = index < 0
    if not len(values):
        return pa.nulls(n, pa.binary())
    taken = pc.take(values, pa.array(np.where(mask, 0, index), mask=mask))
    return taken.cast(pa.binary()) if taken.type != pa.binary() else taken


def pf_headers(headers: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The first ``pf`` header value per row (null when absent, ``b""`` when present but null)."""
    return header_values(headers, PF_HEADER_KEY, present_null=b"")


def _int32(rows: pa.Table, name: str, n: int) -> pa.Array | pa.ChunkedArray:
    """A column as int32 (null when the input has none, e.g. rows built without Spark)."""
    if name not in rows.column_names:
        return pa.nulls(n, pa.int32())
    return rows.column(name).cast(pa.int32())


def _headers(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The Kafka ``headers`` column in the log's type (only the list's field name may differ)."""
    return column if column.type == HEADERS_TYPE else column.cast(HEADERS_TYPE)


def _to_ts(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.cast(pa.int64()).cast(TS_TYPE) if column.type != TS_TYPE else column


def process_partition(
    rows: pa.Table,
    topic: str,
    partition: int,
    st: PartitionState,
    flush_held: bool = False,
    macs: RecordMacCheck | None = None,
    authority: BatchAuthority | None = None,
    now_ms: int | None = None,
) -> PartitionOutput:
    """Apply the rules to one partition's rows (any order; sorted by Kafka offset here).

    ``st`` is updated in place: table, held payloads and the next log offset. With a verifier on
    ``st.table``, the ``pfc`` header is handed to it. With ``macs`` (per-record mode), an
    idempotent record without a valid ``pfm`` is ``FORGED`` before the rules see it. With an
    ``authority`` (the lease servers), producers met beyond a horizon are judged by its answers.
    ``now_ms`` (the wall clock) bounds a horizon: it opens at the first record's time, at most
    the timestamp grace ahead of it, so a record stamped far ahead cannot stretch it.
    """
    offsets = rows.column("offset").to_numpy()
    if len(offsets) > 1 and not bool(np.all(offsets[1:] > offsets[:-1])):
        # The Kafka source hands a partition over in offset order; sort only when it did not.
        rows = rows.sort_by("offset")
        offsets = rows.column("offset").to_numpy()
    n = rows.num_rows
    headers = pf_headers(rows.column("headers"))
    certs = (
        header_values(rows.column("headers"), CERT_HEADER_KEY)
        if st.table.verifier is not None
        else None
    )
    ts = _to_ts(rows.column("timestamp"))
    ts_us = ts.cast(pa.int64()).to_numpy(zero_copy_only=False)
    forged = None
    if macs is not None and n:
        forged = mac_forged(
            macs,
            topic,
            partition,
            decode_headers(headers),
            rows.column("key"),
            rows.column("value"),
            header_values(rows.column("headers"), MAC_HEADER_KEY),
        )
    judged = judge_batch(
        st.table,
        headers,
        ts_us // 1000,
        offsets.tolist(),
        certs,
        forged,
        st.kafka_last,
        now_ms,
        authority,
    )
    res, unread, horizon_ms = judged.result, judged.unread, judged.horizon_ms
    if n:
        st.kafka_last = int(offsets[-1])
    base = pa.table(
        {
            "key": rows.column("key").cast(pa.binary()),
            "value": rows.column("value").cast(pa.binary()),
            "topic": pa.repeat(pa.scalar(topic, pa.string()), n),
            "partition": pa.array(np.full(n, partition, dtype=np.int32)),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": ts,
            "timestampType": _int32(rows, "timestampType", n),
            "headers": _headers(rows.column("headers")),
            "pid": pa.array(res.pid),
            "generation": pa.array(res.generation),
            "seq": pa.array(res.seq),
            "log_offset": pa.nulls(n, pa.int64()),
        },
        schema=LOG_SCHEMA,
    )
    # Records held by earlier batches that this one decided, from the payloads we kept.
    released_rows = [st.held.pop(int(d.ref)) for d in res.released]
    order = with_non_idempotent(res.log_order, res.verdict)
    if released_rows:
        released = _held_table(released_rows, topic, partition).select(LOG_SCHEMA.names)
        source = pa.concat_tables([base, released])
        take = np.where(order >= 0, order, n + (-order - 1))
    else:
        source, take = base, order
    log = source.take(pa.array(take, pa.int64()))
    log_offsets = np.arange(st.next_log, st.next_log + len(take), dtype=np.int64)
    log = log.set_column(_LOG_OFFSET, "log_offset", pa.array(log_offsets))
    st.next_log += len(take)

    verdict = res.verdict
    buffered = np.flatnonzero(verdict == _BUFFERED)
    with_pf = base.append_column("pf", headers)
    for i in buffered.tolist():
        st.held[int(offsets[i])] = _held_row(with_pf, i)
    dropped = np.flatnonzero(_DROPPED[verdict])
    reject_parts = [
        with_pf.take(pa.array(dropped, pa.int64()))
        .select(LOG_SCHEMA.names)
        .append_column("verdict", pa.array(_NAMES[verdict[dropped]].tolist(), pa.string()))
        .append_column("pf", headers.take(pa.array(dropped, pa.int64())))
    ]
    late = [
        (r, d.verdict)
        for r, d in zip(released_rows, res.released, strict=True)
        if not d.verdict.appended
    ]
    flushed: list[Verdict] = []
    if flush_held and st.held:
        # The window closes at the table's own clock: flushing never moves time.
        for d in st.table.flush(st.table.clock):
            late.append((st.held.pop(int(d.ref)), d.verdict))
            flushed.append(d.verdict)
    if late:
        held_rejects = _held_table([r for r, _ in late], topic, partition)
        reject_parts.append(
            held_rejects.select(LOG_SCHEMA.names)
            .append_column("verdict", pa.array([v.name for _, v in late], pa.string()))
            .append_column("pf", held_rejects.column("pf"))
        )
    rejects = pa.concat_tables(reject_parts).sort_by("offset")
    counts: dict[str, int] = {}
    per_code = np.bincount(verdict, minlength=len(VERDICT_CODES))
    for code in np.flatnonzero(per_code).tolist():
        if code != _BUFFERED:
            name = VERDICT_CODES[code].name
            counts[name] = counts.get(name, 0) + int(per_code[code])
    for row_verdict in [d.verdict for d in res.released] + flushed:
        counts[row_verdict.name] = counts.get(row_verdict.name, 0) + 1
    held = _held_table(sorted(st.held.values()), topic, partition)
    gaps = [unread] if unread is not None else []
    if st.table.gaps:
        gaps += seq_gaps(st.table.gaps, res.pid.tolist(), res.seq.tolist(), offsets.tolist())
    return PartitionOutput(
        log,
        rejects,
        held,
        n,
        counts,
        dict(sorted(st.table.forged.items())),
        flush_held,
        gaps,
        horizon_ms,
        None if authority is None else authority.recorded(),
        rules_of(st.table),
    )


@dataclass(frozen=True, slots=True)
class Judged:
    """The rules' decisions on one partition's batch (``result``), the Kafka offsets the sink
    never read before it (``unread``) and the adoption horizon that opened (``horizon_ms``)."""

    result: BatchResult
    unread: GapReport | None
    horizon_ms: int | None


def judge_batch(
    table: ProducerStateTable,
    headers: Any,
    ts_ms: Any,
    offsets: list[int],
    certs: Any,
    forged: Any,
    last_read: int | None,
    now_ms: int | None,
    authority: BatchAuthority | None,
) -> Judged:
    """One partition's records, in offset order, through the rules as the sink decides them
    (the simulation calls this too): a horizon opens where offsets before the first one went
    unread since ``last_read``, capped at ``now_ms`` plus the timestamp grace, so a record
    stamped far ahead cannot stretch it; the ``authority`` answers for producers met beyond it.
    """
    table.forged.clear()
    table.gaps.clear()
    unread = unread_offsets(offsets[0], last_read) if offsets else None
    horizon_ms = None
    if unread is not None:
        # The sink could not have seen producers start before this record (DESIGN §4).
        horizon_ms = int(ts_ms[0])
        if now_ms is not None:
            horizon_ms = min(horizon_ms, now_ms + table.grace_ms)
        table.open_horizon(horizon_ms)
    table.authority = authority
    try:
        result = table.offer_batch(headers, ts_ms, offsets, certs, forged)
    finally:
        table.authority = None
    return Judged(result, unread, horizon_ms)


def with_non_idempotent(order: np.ndarray, verdict: np.ndarray) -> np.ndarray:
    """``log_order`` with the ``NON_IDEMPOTENT`` rows in arrival position.

    The batch path lists only rule-appended rows; a row without a header is appended on arrival,
    so it goes before the first entry of a later row. Released entries (negative) follow the row
    that released them, so they carry that row's index as their position.
    """
    plain = np.flatnonzero(verdict == _NON_IDEMPOTENT)
    plain = plain[~np.isin(plain, order)]
    if not len(plain):
        return order
    key = np.where(order >= 0, order, -1)
    key = np.maximum.accumulate(key) if len(key) else key
    all_key = np.concatenate([key, plain])
    all_idx = np.concatenate([order, plain])
    return all_idx[np.argsort(all_key, kind="stable")].astype(np.int64)


def _held_row(base: pa.Table, i: int) -> HeldRow:
    ts_us = base.column("timestamp").slice(i, 1).cast(pa.int64())[0].as_py()
    return HeldRow.of(base.slice(i, 1).to_pylist()[0], ts_us)


def _held_table(held: list[HeldRow], topic: str, partition: int) -> pa.Table:
    """Held payloads as a table of :data:`HELD_SCHEMA`."""
    m = len(held)
    return pa.table(
        {
            "key": pa.array([h.key for h in held], pa.binary()),
            "value": pa.array([h.value for h in held], pa.binary()),
            "topic": pa.array([topic] * m, pa.string()),
            "partition": pa.array([partition] * m, pa.int32()),
            "offset": pa.array([h.offset for h in held], pa.int64()),
            "timestamp": pa.array([h.timestamp_us for h in held], pa.int64()).cast(TS_TYPE),
            "timestampType": pa.array([h.timestamp_type for h in held], pa.int32()),
            "headers": pa.array([h.headers for h in held], HEADERS_TYPE),
            "pid": pa.array([h.pid for h in held], pa.int64()),
            "generation": pa.array([h.generation for h in held], pa.int64()),
            "seq": pa.array([h.seq for h in held], pa.int64()),
            "log_offset": pa.nulls(m, pa.int64()),
            "pf": pa.array([h.pf for h in held], pa.binary()),
        },
        schema=HELD_SCHEMA,
    )
