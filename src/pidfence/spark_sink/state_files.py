"""State files: the cache of a partition's sink state, one per committed batch.

A state file is ``b"PFS1" + crc32 (4 bytes, big endian) + msgpack`` of::

    {"kind": "full"|"delta", "prev": batch id the delta applies to (or None),
     "prev_tag": that batch's attempt tag, "tag": this batch's attempt tag,
     "table": ProducerStateTable snapshot bytes, "next_log": next log_offset}

Held payloads are not in it: they are committed with the batch (its ``held`` file). Losing any
state file loses nothing: :mod:`pidfence.spark_sink.state` rebuilds from the committed output.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Final

import msgpack

from pidfence.broker_plugin import CorruptSnapshot
from pidfence.spark_sink.manifest import part_name
from pidfence.spark_sink.storage import Store, batch_name

_MAGIC: Final = b"PFS1"
#: The folder of the state files, under the sink's own folder: ``_state/TOPIC~PART/``.
STATE: Final = "_state"


@dataclass(frozen=True)
class StateFile:
    """A decoded state file."""

    kind: str
    prev: int | None
    prev_tag: str | None
    tag: str | None
    table: bytes
    next_log: int


def encode_state(sf: StateFile) -> bytes:
    """State file bytes."""
    body = msgpack.packb(
        {
            "kind": sf.kind,
            "prev": sf.prev,
            "prev_tag": sf.prev_tag,
            "tag": sf.tag,
            "table": sf.table,
            "next_log": sf.next_log,
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
            prev_tag=None if obj.get("prev_tag") is None else str(obj["prev_tag"]),
            tag=None if obj.get("tag") is None else str(obj["tag"]),
            table=bytes(obj["table"]),
            next_log=int(obj["next_log"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptSnapshot(
            f"sink state file is not readable ({exc}); it will be rebuilt"
        ) from exc


def state_dir(store: Store, topic: str, partition: int) -> str:
    """Directory of one partition's state files."""
    return store.join(STATE, part_name(topic, partition))


def state_files(store: Store, topic: str, partition: int) -> dict[int, str]:
    """Batch id → file name of the partition's state files."""
    out: dict[int, str] = {}
    for name in store.list(state_dir(store, topic, partition)):
        stem, _, kind = name.partition(".")
        if kind in ("full", "delta") and stem.isdigit():
            out[int(stem)] = name
    return out


def drop_old_chains(store: Store, directory: str, batch_id: int) -> None:
    """Keep the newest *intact* older full chain as a fallback; drop files older than it.

    A damaged older full snapshot is no fallback, so the search goes on to the next older one
    (otherwise the only intact chain could be deleted).
    """
    fulls = sorted(
        (
            int(n.partition(".")[0])
            for n in store.list(directory)
            if n.endswith(".full") and n.partition(".")[0].isdigit()
        ),
        reverse=True,
    )
    keep_from: int | None = None
    for bid in fulls:
        if bid >= batch_id:
            continue
        try:
            decode_state(store.read(f"{directory}/{batch_name(bid)}.full"))
        except (CorruptSnapshot, OSError):
            continue
        keep_from = bid
        break
    if keep_from is None:
        return
    for n in store.list(directory):
        stem = n.partition(".")[0]
        if stem.isdigit() and int(stem) < keep_from:
            store.delete(f"{directory}/{n}")
