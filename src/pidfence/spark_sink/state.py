"""A partition's sink state: the rules table, held payloads and the next log offset.

What the sink committed (every committed batch's decisions and held records, named by its
manifest) determines the state exactly (DESIGN §4 amended); state files are only a cache of it.
A task loads the state as of the newest committed batch that read its partition; if that batch's
state file is missing, damaged or from another attempt, it restores the newest intact older chain
(or nothing) and replays the committed batches after it through the broker rules
(:func:`pidfence.broker_plugin.replay_batch`), which gives the same table, held records included.
Another error reading a state file (a store's timeout) fails the task, which Spark retries: a
rebuild walks the partition's history, far dearer than a retry.

The state files themselves (their codec, names and clean-up) are :mod:`~pidfence.spark_sink.
state_files`; held payloads are committed with each batch (its ``held`` file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pidfence.broker_plugin import (
    CorruptSnapshot,
    ProducerStateTable,
    Verifier,
    replay_batch,
)
from pidfence.broker_plugin.entry import SettingOverrides
from pidfence.spark_sink.authority import recorded_answers
from pidfence.spark_sink.decisions import replay_rows
from pidfence.spark_sink.manifest import PartCommit, part_name
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.state_files import (
    StateFile,
    decode_state,
    drop_old_chains,
    encode_state,
    state_dir,
    state_name,
)
from pidfence.spark_sink.storage import Store
from pidfence.wire import Verdict


class HeldRow(NamedTuple):
    """A record held for reordering, as the batch that holds it keeps it (ordered by offset)."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_us: int
    pid: int
    generation: int
    seq: int
    #: The raw ``pf`` header.
    pf: bytes | None
    timestamp_type: int | None
    #: As Kafka's source gives them: a list of ``{"key", "value"}``, or None.
    headers: list[dict[str, Any]] | None

    @classmethod
    def of(cls, row: dict[str, Any], timestamp_us: int) -> HeldRow:
        """From a row of a batch (with its ``pf`` column) or of a held file."""
        return cls(
            int(row["offset"]),
            row["key"],
            row["value"],
            int(timestamp_us),
            int(row["pid"]),
            int(row["generation"]),
            int(row["seq"]),
            row["pf"],
            row["timestampType"],
            row["headers"],
        )


@dataclass
class PartitionState:
    """What one task needs to continue a partition's log."""

    table: ProducerStateTable
    held: dict[int, HeldRow] = field(default_factory=dict)
    next_log: int = 0
    #: batch id of the state file this was loaded from (None: fresh or rebuilt).
    base_batch: int | None = None
    #: name of that state file.
    base_name: str | None = None
    #: state files since the last full one, including base_batch's.
    chain_len: int = 0
    #: the newest committed batch that read this partition (None: none yet).
    last_batch: int | None = None
    #: the highest Kafka offset of the partition the committed batches read (None: none).
    kafka_last: int | None = None
    #: bytes of the state chain (full snapshot and deltas) it was loaded from, then saved as.
    state_bytes: int = 0
    #: batch id of the full state file beginning the committed chain this state was loaded or
    #: rebuilt from (None: none): the fallback kept when the next full one is written.
    floor: int | None = None


def new_table(opts: SinkOptions, verifier: Verifier | None = None) -> ProducerStateTable:
    """An empty table with the sink's settings."""
    return ProducerStateTable(
        opts.capacity,
        opts.lifetime_ms,
        opts.reorder_window,
        opts.grace_ms,
        verifier,
        resolve_gaps=opts.resolve_gaps,
    )


def _overrides(opts: SinkOptions) -> dict[str, Any]:
    """The rules' settings as the sink's options set them (each named as the options name it)."""
    return {name: getattr(opts, name) for name in SettingOverrides.__annotations__}


class Chain(NamedTuple):
    """A state chain restored: its table, last file, length, size and the full file's batch."""

    table: ProducerStateTable
    last: StateFile
    length: int
    size: int
    floor: int


def _restore_chain(
    store: Store, topic: str, partition: int, name: str, tag: str, opts: SinkOptions
) -> Chain:
    """The chain ending at state file ``name``, which attempt ``tag`` wrote.

    Every link is read by the name its successor records: no folder is listed."""
    chain: list[StateFile] = []
    size = 0
    link: str | None = name
    first = name
    while link is not None:
        first = link
        data = store.read(f"{state_dir(store, topic, partition)}/{link}")
        size += len(data)
        sf = decode_state(data)
        if sf.tag != (tag if not chain else link.split(".")[1]):
            # Written by an attempt whose batch was not the committed one.
            raise CorruptSnapshot(f"state file {link} is from another attempt")
        chain.append(sf)
        link = sf.prev_name if sf.kind == "delta" else None
    chain.reverse()
    if chain[0].kind != "full":
        raise CorruptSnapshot(f"state chain of {topic}[{partition}] does not start with a full")
    table = ProducerStateTable.restore_chain(
        chain[0].table, [c.table for c in chain[1:]], **_overrides(opts)
    )
    return Chain(table, chain[-1], len(chain), size, int(first.partition(".")[0]))


def load_state(
    output: Output,
    topic: str,
    partition: int,
    batch_id: int,
    opts: SinkOptions,
    verifier: Verifier | None = None,
) -> PartitionState:
    """The partition's state as of the newest committed batch below ``batch_id``.

    Steady state: one index lookup, the newest state chain and the held file. After a lost or
    damaged state file: the newest intact older chain (or nothing) plus a replay of the committed
    batches since (see the module docstring).
    """
    last = output.last_committed_before(batch_id)
    pos = None if last is None else output.positions(last).get(part_name(topic, partition))
    if pos is None:
        return PartitionState(new_table(opts, verifier))
    top, part = pos.batch, pos.part
    store = output.own
    held = _held_payloads(output.read_held(part))
    try:
        found = _restore_chain(store, topic, partition, part.state, part.tag, opts)
    except (CorruptSnapshot, FileNotFoundError):
        pass
    else:
        found.table.verifier = verifier
        return PartitionState(
            found.table,
            held,
            found.last.next_log,
            top,
            part.state,
            found.length,
            top,
            part.kafka_last,
            found.size,
            found.floor,
        )
    table, floor = _rebuild(output, topic, partition, top, part, opts, verifier)
    # The old batches replayed under the settings they recorded; this one runs under today's.
    for name, value in _overrides(opts).items():
        if name != "capacity":
            setattr(table, name, value)
    refs = {h.ref for h in table.waiting()}
    if refs != set(held):
        raise CorruptSnapshot(
            f"{topic}[{partition}]: replaying the committed output holds {sorted(refs)} but "
            f"batch {top} committed {sorted(held)} as held"
        )
    return PartitionState(
        table, held, part.log_end, None, None, 0, top, part.kafka_last, floor=floor
    )


def _held_payloads(table: pa.Table | None) -> dict[int, HeldRow]:
    if table is None:
        return {}
    ts = table.column("timestamp").cast(pa.int64()).to_pylist()
    held = (HeldRow.of(row, ts_us) for row, ts_us in zip(table.to_pylist(), ts, strict=True))
    return {row.offset: row for row in held}


def _rebuild(
    output: Output,
    topic: str,
    partition: int,
    top: int,
    top_part: PartCommit,
    opts: SinkOptions,
    verifier: Verifier | None,
) -> tuple[ProducerStateTable, int | None]:
    """Newest intact older chain on this partition's batch chain, plus a replay since then; and
    that chain's floor (None: replayed from the partition's first batch).

    The walk back (one manifest per batch, linked by ``prev``) stops at the first batch whose
    state chain is intact: a lost newest state costs the batches since the previous full one.
    The table carries ``verifier`` (this run's); the batches replay signed where it is set.
    """
    replay: list[tuple[int, PartCommit]] = [(top, top_part)]  # newest first
    while (prev := replay[-1][1].prev) is not None:
        manifest = output.committed(prev)
        part = manifest.part(topic, partition) if manifest is not None else None
        if part is None:
            raise CorruptSnapshot(
                f"{topic}[{partition}]: the committed history before batch {replay[-1][0]} "
                "is missing; cannot rebuild the state"
            )
        try:
            chain = _restore_chain(output.own, topic, partition, part.state, part.tag, opts)
        except (CorruptSnapshot, FileNotFoundError):
            replay.append((prev, part))
            continue
        chain.table.verifier = verifier
        _replay(output, chain.table, replay[::-1], top_part, part.kafka_last)
        return chain.table, chain.floor
    table = new_table(opts, verifier)
    _replay(output, table, replay[::-1], top_part, -1)
    return table, None


def _replay(
    output: Output,
    table: ProducerStateTable,
    parts: list[tuple[int, PartCommit]],
    top_part: PartCommit,
    after: int,
) -> None:
    """Replay every record of ``parts`` (batch id and part; Kafka offsets > ``after``) batch by
    batch.

    The records come from the batches' decisions (:mod:`decisions`), the sink's own account of
    what it committed: rows deleted from the table later, or appended by another writer, do not
    change it.
    """
    pieces: list[pa.Table] = []
    for batch_id, part in parts:
        decided = output.read_decided(batch_id, part)
        if decided is not None:
            pieces.append(replay_rows(decided))
    held = output.read_held(top_part)
    if held is not None:
        pieces.append(replay_rows(held, Verdict.BUFFERED.value))
    if not pieces:
        return
    rows = pa.concat_tables(pieces).sort_by("offset")
    rows = rows.filter(pc.greater(rows["offset"], after))
    offsets = rows.column("offset").to_numpy()
    for _, part in parts:
        a, b = np.searchsorted(offsets, [part.kafka_first, part.kafka_last + 1])
        chunk = rows.slice(int(a), int(b - a))
        replay_batch(
            table,
            chunk.column("pf").to_pylist(),
            chunk.column("ts_ms").to_pylist(),
            chunk.column("verdict").to_pylist(),
            chunk.column("offset").to_pylist(),
            flush=part.flushed,
            horizon_ms=part.horizon_ms,
            answers=recorded_answers(part.answers),
            rules=dict(part.rules) or None,
            signed=table.verifier is not None,
        )


def save_state(
    store: Store,
    topic: str,
    partition: int,
    batch_id: int,
    st: PartitionState,
    opts: SinkOptions,
    tag: str,
) -> str:
    """Write the state as of ``batch_id``: a delta normally, a full one every ``compact_every``.

    Returns the file name, which carries the attempt ``tag`` (a loader trusts only the file the
    committed manifest names, and twin attempts never overwrite each other's), and sets
    ``st.state_bytes`` to the size of the chain it ends.
    """
    full = st.base_batch is None or st.chain_len >= opts.compact_every + 1
    blob = st.table.snapshot() if full else st.table.snapshot_delta()
    sf = StateFile(
        kind="full" if full else "delta",
        prev=None if full else st.base_batch,
        prev_name=None if full else st.base_name,
        tag=tag,
        table=blob,
        next_log=st.next_log,
    )
    name = state_name(batch_id, tag, sf.kind)
    directory = state_dir(store, topic, partition)
    data = encode_state(sf)
    # Attempt-unique and a cache: a torn file (crash) fails its CRC and the state is rebuilt.
    store.put_staged(f"{directory}/{name}", data)
    st.state_bytes = len(data) + (0 if full else st.state_bytes)
    if full and st.floor is not None:
        drop_old_chains(store, directory, st.floor)
    return name
