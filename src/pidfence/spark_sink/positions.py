"""Where each partition's history stands: per partition (``TOPIC~PART``), the newest committed
batch that read it, and that batch's part. A task loads the partition's state from there.

Found without reading every manifest: every :data:`INDEX_EVERY` batches the driver writes a
compacted index of all positions (``P/_pidfence/_manifests/_index/BATCH.json``; ``latest`` names
the newest, two are kept), so a reader starts at the newest index at or below the batch it wants
and reads at most :data:`INDEX_EVERY` manifests after it. A process keeps the newest positions it
found per output, so the next batch's tasks read only the manifests since.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Final

from pidfence.spark_sink.manifest import (
    BatchManifest,
    Position,
    decode_positions,
    encode_positions,
)
from pidfence.spark_sink.storage import Store, batch_name

#: A compacted index of every partition's position is written every this many batches, so a
#: task reads at most this many manifests to find its partition's position (flat cost). Old
#: batches are folded at the same pace (:mod:`~pidfence.spark_sink.fold`).
INDEX_EVERY: Final = 64
#: Where the index files are, under the sink's own folder (``P/_pidfence``).
INDEX: Final = "_manifests/_index"
#: Per (sink folder, query, log table id): the newest positions this process found, and the
#: batch they are as of (a Python worker runs the next batch's tasks from them).
_KNOWN: dict[tuple[str, str, str], tuple[int, dict[str, Position]]] = {}


def _index_path(own: Store, batch_id: int) -> str:
    return own.join(INDEX, batch_name(batch_id) + ".json")


def _latest_index(own: Store, last: int) -> tuple[int, dict[str, Position]]:
    """(batch id, positions) of the newest index at or below ``last``; (-1, {}) if none."""
    try:
        latest = int(own.read(own.join(INDEX, "latest")).decode())
    except (FileNotFoundError, ValueError):
        latest = -1
    own_period = (last // INDEX_EVERY) * INDEX_EVERY
    # ``latest`` past ``last``: a reader of history steps back. Below ``last``'s own period:
    # a stalled instance may have moved it back (it is replaced, not compared-and-set).
    for at in dict.fromkeys([own_period, *range(min(latest, own_period), -1, -INDEX_EVERY)]):
        with contextlib.suppress(FileNotFoundError):
            return at, decode_positions(own.read(_index_path(own, at)))
    return -1, {}


def find_positions(
    own: Store,
    output_key: tuple[str, str, str],
    last: int,
    committed: Callable[[int], BatchManifest | None],
    settled: bool,
) -> dict[str, Position]:
    """Per partition, the newest committed batch <= ``last`` that read it: the positions this
    process found last for this output, else the newest index, then at most INDEX_EVERY
    manifests (committed manifests never change).

    Args:
        own: the sink's own folder (``P/_pidfence``).
        output_key: (own folder, query id, log table id): whose positions these are.
        committed: a batch's manifest if it is committed (None if not).
        settled: ``last`` is at or below the query's committed version, so the positions found
            are kept for the next batch.
    """
    known = _KNOWN.get(output_key)
    if known is not None and known[0] <= last < known[0] + INDEX_EVERY:
        base, positions = known[0], dict(known[1])
    else:
        base, positions = _latest_index(own, last)
    for batch_id in range(base + 1, last + 1):
        manifest = committed(batch_id)
        for part in manifest.parts if manifest is not None else ():
            positions[part.name] = Position(batch_id, part)
    if settled and (known is None or last >= known[0]):
        if len(_KNOWN) >= 8 and output_key not in _KNOWN:
            _KNOWN.clear()  # a process serves a few outputs at most
        _KNOWN[output_key] = (last, dict(positions))
    return positions


def write_index(own: Store, batch_id: int, positions: Mapping[str, Position]) -> None:
    """Write the index as of the committed ``batch_id`` and point ``latest`` at it."""
    own.put(_index_path(own, batch_id), encode_positions(batch_id, positions))
    own.put(own.join(INDEX, "latest"), str(batch_id).encode())
    # Readers start at the newest index: two are kept.
    own.delete(_index_path(own, batch_id - 2 * INDEX_EVERY))


__all__ = ["INDEX", "INDEX_EVERY", "find_positions", "write_index"]
