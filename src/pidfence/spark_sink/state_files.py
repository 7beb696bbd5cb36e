"""State files: the cache of a partition's sink state, one per task attempt.

A state file is named ``BATCH.TAG.full|delta`` (by batch *and* attempt: twin attempts of a batch
never overwrite each other's; the committed manifest names the one to trust), and holds
``b"PFS1" + crc32 (4 bytes, big endian) + msgpack`` of::

    {"kind": "full"|"delta", "prev": batch id the delta applies to (or None),
     "prev_name": the name of the state file it applies to, "tag": this attempt's tag,
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
    prev_name: str | None
    tag: str | None
    table: bytes
    next_log: int


def encode_state(sf: StateFile) -> bytes:
    """State file bytes."""
    body = msgpack.packb(
        {
            "kind": sf.kind,
            "prev": sf.prev,
            "prev_name": sf.prev_name,
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
            prev_name=None if obj.get("prev_name") is None else str(obj["prev_name"]),
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


def state_name(batch_id: int, tag: str, kind: str) -> str:
    """``BATCH.TAG.KIND``: a state file's name."""
    return f"{batch_name(batch_id)}.{tag}.{kind}"


def drop_old_chains(store: Store, directory: str, floor: int) -> None:
    """Delete the state files of batches before ``floor``.

    ``floor`` is the batch of the full file beginning the committed chain the writer's state was
    loaded from: that chain stays as the fallback for the full file being written. Another
    attempt's snapshot (a failed attempt wrote a full one after rebuilding) is never the fallback
    chosen: a loader trusts only what the committed manifests name.
    """
    for name in store.list(directory):
        stem = name.partition(".")[0]
        if stem.isdigit() and int(stem) < floor:
            store.delete(f"{directory}/{name}")
