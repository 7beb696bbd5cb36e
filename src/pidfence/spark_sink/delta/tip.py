"""A query's transaction version in a Delta table, found without listing ``_delta_log/``.

Loading or updating a deltalake table lists its log folder, and on a local disk that listing
reads every entry (object_store lists a local folder in full, then filters): its cost grows with
the commits the table's log retention keeps, about 3 µs an entry, 0.6 s per update for 200,000
commits. A task asks every batch only which batch its query committed last. The answer is kept
per process and brought forward by reading the commits after it by name (``V+1.json``,
``V+2.json`` … until one is absent): one or two small reads a batch, whatever the log's age.

It falls back to deltalake (one listing) when the file at the known version is gone and no
checkpoint covers it (the table was replaced), or the newest checkpoint is past the known version
(log cleanup may have removed commits after it): a commit is never skipped. A table replaced by
one with fewer commits is :class:`~pidfence.spark_sink.delta.errors.TableGone`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from pidfence.spark_sink.delta.checkpoints import last_checkpoint
from pidfence.spark_sink.delta.commit import check_log
from pidfence.spark_sink.storage import Store


@dataclass(frozen=True)
class Tip:
    """A table as of one version: that version, its id and one query's transaction version."""

    version: int
    table_id: str
    txn: int | None


_TIPS: dict[tuple[str, str], Tip] = {}
_LOCK = threading.Lock()


def _commit(table: Store, version: int) -> str:
    return table.join("_delta_log", f"{version:020d}.json")


def _advance(table: Store, query_id: str, tip: Tip) -> Tip:
    """``tip`` moved past every commit after it (read by name until one is absent)."""
    version, table_id, txn = tip.version, tip.table_id, tip.txn
    while True:
        try:
            data = table.read(_commit(table, version + 1))
        except FileNotFoundError:
            return Tip(version, table_id, txn)
        for line in data.splitlines():
            action = json.loads(line) if line.strip() else {}
            if (found := action.get("txn")) and found.get("appId") == query_id:
                txn = int(found["version"])
            elif found := action.get("metaData"):
                table_id = str(found["id"])
        version += 1


def _intact(table: Store, tip: Tip) -> bool:
    """No commit after ``tip`` can have been cleaned up, and the table is the same one."""
    newest_checkpoint = last_checkpoint(table)
    if newest_checkpoint > tip.version:
        return False
    return newest_checkpoint == tip.version or table.exists(_commit(table, tip.version))


def query_tip(table: Store, query_id: str, load: Callable[[], DeltaTable]) -> Tip:
    """The table's newest version, id and ``query_id``'s transaction version.

    Args:
        load: the table from deltalake, up to date (called the first time in a process, and
            when the commits after the known version cannot all be read by name).
    """
    key = (table.uri, query_id)
    with _LOCK:
        known = _TIPS.get(key)
    tip = None if known is None else _advance(table, query_id, known)
    if tip is None or not _intact(table, tip):
        dt = load()
        try:
            tip = Tip(dt.version(), str(dt.metadata().id), dt.transaction_version(query_id))
        except DeltaError:
            if known is not None:  # the log lost the version this process read: say why
                check_log(table, known.version)
            raise
    with _LOCK:
        _TIPS[key] = tip
    return tip


__all__ = ["Tip", "query_tip"]
