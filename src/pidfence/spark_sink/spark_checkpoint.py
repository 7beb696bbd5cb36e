"""What Spark's checkpoint of the sink's query says, read through :class:`~.storage.Store` (a
checkpoint on S3 reads like a local one): whether it committed a batch, its query id, where its
first batch started and where the next run starts.

Spark's layout: ``metadata`` (the query id), ``offsets/N`` (batch N's end offsets, planned),
``commits/N`` (batch N committed), ``sources/S/0`` (source S's initial offsets). Every reader
answers "nothing known" for a checkpoint that is missing or unreadable; what to do then is the
caller's decision.
"""

from __future__ import annotations

import json

import pyarrow as pa

from pidfence.spark_sink.storage import Store


def checkpoint_committed(checkpoint: str | None, batch: int | None = None) -> bool:
    """Whether Spark's checkpoint records a committed batch (``<checkpoint>/commits/N``), or
    batch ``batch`` committed."""
    if not checkpoint:
        return False
    try:
        store = Store.at(checkpoint)
        if batch is not None:
            return store.exists(store.join("commits", str(batch)))
        return any(name.isdigit() for name in store.list(store.join("commits")))
    except (OSError, ValueError, pa.ArrowException):
        return False


def checkpoint_query_id(checkpoint: str | None) -> str | None:
    """The query id Spark keeps in ``<checkpoint>/metadata``, if it can be read."""
    if not checkpoint:
        return None
    try:
        store = Store.at(checkpoint)
        text = store.read(store.join("metadata")).decode()
        # The file holds one JSON object per line; the first is {"id": ...}.
        value = json.loads(text.splitlines()[0])["id"]
    except (OSError, ValueError, KeyError, IndexError, TypeError, pa.ArrowException):
        return None
    return str(value)


def initial_offsets(checkpoint: str) -> dict[tuple[str, int], int]:
    """Where a checkpoint's first batch starts reading each partition, from Spark's record of
    each Kafka source's initial offsets (``sources/N/0``: a zero byte, ``v1``, then JSON);
    empty when there is none to read."""
    found: dict[tuple[str, int], int] = {}
    try:
        store = Store.at(checkpoint)
        sources = store.list(store.join("sources"))
    except (OSError, ValueError):
        return found
    for source in sources:
        try:
            text = store.read(store.join("sources", source, "0")).lstrip(b"\0").decode()
            doc = json.loads(text.partition("\n")[2])
        except (OSError, ValueError):
            continue
        for topic, parts in doc.items() if isinstance(doc, dict) else ():
            for partition, offset in parts.items() if isinstance(parts, dict) else ():
                found[(str(topic), int(partition))] = int(offset)
    return found


def start_offsets(
    checkpoint: str, watermarks: dict[tuple[str, int], tuple[int, int]], starting: str
) -> dict[tuple[str, int], int]:
    """Where this run starts reading each partition: after the checkpoint's last committed batch,
    else ``starting`` (earliest: the low watermark, latest: the high one)."""
    default = {
        tp: (low if starting == "earliest" else high) for tp, (low, high) in watermarks.items()
    }
    try:  # through Store: a checkpoint on S3 is read like a local one
        store = Store.at(checkpoint)
        commits = sorted(int(n) for n in store.list(store.join("commits")) if n.isdigit())
        if not commits:
            return default
        lines = store.read(store.join("offsets", str(commits[-1]))).decode().splitlines()
    except (OSError, ValueError, pa.ArrowException):
        return default
    out = dict(default)
    for line in lines[2:]:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        for topic, parts in doc.items():
            if isinstance(parts, dict):
                for partition, offset in parts.items():
                    out[(topic, int(partition))] = int(offset)
    return out


__all__ = ["checkpoint_committed", "checkpoint_query_id", "initial_offsets", "start_offsets"]
