"""A partition's sink state: the rules table, held payloads and the next log offset.

A state file is ``b"PFS1" + crc32 (4 bytes, big endian) + msgpack`` of::

    {"kind": "full"|"delta", "prev": batch id the delta applies to (or None),
     "table": ProducerStateTable snapshot bytes, "next_log": next log_offset,
     "held": [[kafka_offset, key, value, timestamp_us, pid, generation, seq], ...]}

``held`` is always complete (it is bounded by reorder_window per producer) so only the table part
is incremental.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack
import pyarrow as pa
import pyarrow.compute as pc

from pidfence.broker_plugin import CorruptSnapshot, ProducerStateTable, rebuild
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.storage import (
    DATA,
    STATE,
    Store,
    batch_name,
    last_committed_before,
    manifest_ids,
    part_name,
    read_manifest,
)
from pidfence.wire import FLAG_FENCE, Verdict, encode_pf

_MAGIC: Final = b"PFS1"
HeldRow = tuple[int, bytes | None, bytes | None, int, int, int, int]


@dataclass
class PartitionState:
    """What one task needs to continue a partition's log."""

    table: ProducerStateTable
    held: dict[int, HeldRow] = field(default_factory=dict)
    next_log: int = 0
    #: batch id of the state file this was loaded from (None: fresh or rebuilt).
    base_batch: int | None = None
    #: state files since the last full one, including base_batch's.
    chain_len: int = 0


@dataclass(frozen=True)
class StateFile:
    """A decoded state file."""

    kind: str
    prev: int | None
    table: bytes
    next_log: int
    held: list[HeldRow]


def encode_state(sf: StateFile) -> bytes:
    """State file bytes."""
    body = msgpack.packb(
        {
            "kind": sf.kind,
            "prev": sf.prev,
            "table": sf.table,
            "next_log": sf.next_log,
            "held": [list(h) for h in sf.held],
        },
        use_bin_type=True,
    )
    return _MAGIC + struct.pack(">I", zlib.crc32(body)) + body


def decode_state(data: bytes) -> StateFile:
    """Parse state file bytes; :class:`CorruptSnapshot` on any damage."""
    if len(data) < 8 or data[:4] != _MAGIC:
        raise CorruptSnapshot("sink state file has no PFS1 header; it will be rebuilt")
    body = data[8:]
    if struct.unpack(">I", data[4:8])[0] != zlib.crc32(body):
        raise CorruptSnapshot("sink state file fails its CRC; it will be rebuilt")
    try:
        obj = msgpack.unpackb(body, raw=False)
        return StateFile(
            kind=str(obj["kind"]),
            prev=None if obj["prev"] is None else int(obj["prev"]),
            table=bytes(obj["table"]),
            next_log=int(obj["next_log"]),
            held=[_held_row(h) for h in obj["held"]],
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptSnapshot(
            f"sink state file is not readable ({exc}); it will be rebuilt"
        ) from exc


def _held_row(raw: Any) -> HeldRow:
    offset, key, value, ts_us, pid, generation, seq = raw
    return (
        int(offset),
        None if key is None else bytes(key),
        None if value is None else bytes(value),
        int(ts_us),
        int(pid),
        int(generation),
        int(seq),
    )


def state_dir(store: Store, topic: str, partition: int) -> str:
    """Directory of one partition's state files."""
    return store.join(STATE, part_name(topic, partition))


def state_files(store: Store, topic: str, partition: int) -> dict[int, str]:
    """Batch id → file name of the partition's state files."""
    out: dict[int, str] = {}
    for name in store.listdir(state_dir(store, topic, partition)):
        stem, _, kind = name.partition(".")
        if kind in ("full", "delta") and stem.isdigit():
            out[int(stem)] = name
    return out


def _table_kwargs(opts: SinkOptions) -> dict[str, int]:
    return {
        "capacity": opts.capacity,
        "lifetime_ms": opts.lifetime_ms,
        "reorder_window": opts.reorder_window,
    }


def _restore_chain(
    store: Store, topic: str, partition: int, files: dict[int, str], top: int, opts: SinkOptions
) -> PartitionState:
    chain: list[StateFile] = []
    bid: int | None = top
    while bid is not None:
        if bid not in files:
            raise CorruptSnapshot(f"state chain of {topic}[{partition}] misses batch {bid}")
        sf = decode_state(store.read_bytes(f"{state_dir(store, topic, partition)}/{files[bid]}"))
        chain.append(sf)
        bid = sf.prev if sf.kind == "delta" else None
    chain.reverse()
    if chain[0].kind != "full":
        raise CorruptSnapshot(f"state chain of {topic}[{partition}] does not start with a full")
    table = ProducerStateTable.restore_chain(
        chain[0].table, [c.table for c in chain[1:]], **_table_kwargs(opts)
    )
    top_file = chain[-1]
    return PartitionState(
        table, {h[0]: h for h in top_file.held}, top_file.next_log, top, len(chain)
    )


def load_state(
    store: Store, topic: str, partition: int, batch_id: int, opts: SinkOptions
) -> PartitionState:
    """The partition's state as of the newest committed batch below ``batch_id``.

    Uses the newest intact state chain at or below that batch; when the newest is missing or
    corrupt, an older one is rolled forward with the committed log (appended records and FENCE
    rejects, in Kafka offset order) through :func:`pidfence.broker_plugin.rebuild`.
    """
    last = last_committed_before(store, batch_id)
    fresh = PartitionState(ProducerStateTable(**_table_kwargs(opts)))
    if last is None:
        return fresh
    files = state_files(store, topic, partition)
    base = fresh
    for bid in sorted((b for b in files if b <= last), reverse=True):
        try:
            base = _restore_chain(store, topic, partition, files, bid, opts)
        except (CorruptSnapshot, FileNotFoundError, OSError):
            continue
        break
    if base.base_batch == last or (
        base.base_batch is not None and not _touched_since(store, topic, partition, base, last)
    ):
        # Batches that did not read this partition change nothing: the chain continues as is.
        return base
    return _roll_forward(store, topic, partition, base, last, opts)


def _touched_since(
    store: Store, topic: str, partition: int, base: PartitionState, last: int
) -> bool:
    start = -1 if base.base_batch is None else base.base_batch
    for bid in manifest_ids(store):
        if start < bid <= last and any(
            p["topic"] == topic and p["partition"] == partition
            for p in read_manifest(store, bid)["parts"]
        ):
            return True
    return False


def _roll_forward(
    store: Store,
    topic: str,
    partition: int,
    base: PartitionState,
    last: int,
    opts: SinkOptions,
) -> PartitionState:
    start = -1 if base.base_batch is None else base.base_batch
    name = part_name(topic, partition)
    pieces: list[pa.Table] = []
    next_log = base.next_log
    for bid in manifest_ids(store):
        if not start < bid <= last:
            continue
        for part in read_manifest(store, bid)["parts"]:
            if part["topic"] != topic or part["partition"] != partition:
                continue
            next_log = int(part["log_end"])
            cols = ["pid", "generation", "seq", "kafka_offset", "timestamp"]
            if part["appended"]:
                data = store.read_table(store.join(DATA, batch_name(bid), name + ".parquet"))
                pieces.append(
                    data.select(cols).append_column("fence", pa.array([False] * len(data)))
                )
            if part["counts"].get(Verdict.FENCE.name):
                rejects = Store.at(opts.rejects_path)
                rej = rejects.read_table(rejects.join(batch_name(bid), name + ".parquet"))
                rej = rej.filter(pc.equal(rej["verdict"], Verdict.FENCE.name)).select(cols)
                pieces.append(rej.append_column("fence", pa.array([True] * len(rej))))
    records: list[tuple[bytes | None, int]] = []
    if pieces:
        rows = pa.concat_tables(pieces).sort_by("kafka_offset").to_pylist()
        records = [_replay_record(r) for r in rows]
    snapshot = base.table.snapshot() if base.base_batch is not None else None
    table = rebuild(snapshot, records, **_table_kwargs(opts))
    held = {ref: row for ref, row in base.held.items() if ref in _held_refs(table)}
    return PartitionState(table, held, next_log, None, 0)


def _replay_record(row: dict[str, Any]) -> tuple[bytes | None, int]:
    ts_ms = int(row["timestamp"].timestamp() * 1000)
    if not row["pid"]:
        return None, ts_ms
    flags = FLAG_FENCE if row["fence"] else 0
    return encode_pf(row["pid"], row["generation"], row["seq"], flags), ts_ms


def _held_refs(table: ProducerStateTable) -> set[Any]:
    return {h.ref for by_seq in table.held.values() for h in by_seq.values()}


def save_state(
    store: Store,
    topic: str,
    partition: int,
    batch_id: int,
    st: PartitionState,
    opts: SinkOptions,
) -> str:
    """Write the state as of ``batch_id``: a delta normally, a full one every ``compact_every``.

    Returns the file name. Work is proportional to the producers this batch touched, except on
    compaction.
    """
    full = st.base_batch is None or st.chain_len >= opts.compact_every + 1
    blob = st.table.snapshot() if full else st.table.snapshot_delta()
    sf = StateFile(
        kind="full" if full else "delta",
        prev=None if full else st.base_batch,
        table=blob,
        next_log=st.next_log,
        held=sorted(st.held.values()),
    )
    name = f"{batch_name(batch_id)}.{sf.kind}"
    directory = state_dir(store, topic, partition)
    store.write_bytes(f"{directory}/{name}", encode_state(sf))
    # A replay may have left the other kind for this batch id; only one may exist.
    other = f"{batch_name(batch_id)}.{'delta' if full else 'full'}"
    store.delete_file(f"{directory}/{other}")
    if full:
        _drop_old_chains(store, directory, batch_id)
    return name


def _drop_old_chains(store: Store, directory: str, batch_id: int) -> None:
    """Keep the previous full chain (fallback when the newest is damaged); drop older files."""
    fulls = [
        int(n.partition(".")[0])
        for n in store.listdir(directory)
        if n.endswith(".full") and int(n.partition(".")[0]) < batch_id
    ]
    if not fulls:
        return
    keep_from = max(fulls)
    for n in store.listdir(directory):
        stem = n.partition(".")[0]
        if stem.isdigit() and int(stem) < keep_from:
            store.delete_file(f"{directory}/{n}")


def held_rows(rows: Iterable[HeldRow]) -> list[HeldRow]:
    """Held payloads in Kafka offset order."""
    return sorted(rows)
