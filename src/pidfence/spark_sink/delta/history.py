"""Sharing the table the way Delta's own streaming sink does: what other writers' commits mean.

Other writers may append beside the sink, set properties and comments, add columns and
constraints, OPTIMIZE (z-order too), VACUUM, DELETE, UPDATE, write checkpoints and clean the log:
none of that stops it, because the sink's state derives from its own commits (the decisions
files), never from the rows a table holds. Before each batch commit, :func:`check_shared` looks
only for what it cannot continue from:

* its columns removed or retyped (:class:`SchemaChanged`);
* a RESTORE that took the table back to before its last committed batch
  (:class:`RestoredPastSink`): the batch's rows are gone while the sink's state and Spark's
  checkpoint say they are there.

A table gone (:class:`TableGone`) is found by :mod:`~pidfence.spark_sink.delta.commit`.

Each message names the commit version, its operation and what to do.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any, Final

from deltalake import DeltaTable

from pidfence.spark_sink.delta.errors import RestoredPastSink
from pidfence.spark_sink.delta.table import (
    WRITER,
    WRITER_KEY,
    TableKind,
    check_marker,
    schema_changed,
    schema_of,
    schema_problems,
    table_schema,
)

#: Commit-info keys of a sink batch commit (besides ``pidfence.writer``).
QUERY_KEY: Final = "pidfence.query"
BATCH_KEY: Final = "pidfence.batch"
#: History entries read per step when looking for the sink's own last commit.
_STEP: Final = 16

_OWN: dict[str, int] = {}
_OWN_LOCK = threading.Lock()


def is_batch_commit(commit: dict[str, Any]) -> bool:
    """Whether a history entry is a sink batch commit (not table care by pidfence)."""
    return commit.get(WRITER_KEY) == WRITER and commit.get(BATCH_KEY) is not None


def remember_own(uri: str, version: int) -> None:
    """Record the table version of this process's newest batch commit to ``uri``."""
    with _OWN_LOCK:
        _OWN[uri] = max(version, _OWN.get(uri, -1))


def last_own_version(dt: DeltaTable, uri: str) -> int | None:
    """The table version of the sink's newest batch commit (None when it made none).

    Known after this process's own commit; otherwise found by walking the history back from
    the newest commit (normally the sink's own, so one commit file is read).
    """
    latest = dt.version()
    with _OWN_LOCK:
        known = _OWN.get(uri)
    if known is not None and known <= latest:
        return known
    limit = _STEP
    while True:
        history = dt.history(limit)
        for commit in history:  # newest first
            if is_batch_commit(commit):
                version = int(commit["version"])
                remember_own(uri, version)
                return version
        if len(history) < limit:
            return None
        limit *= 4


def _stamp(text: str) -> int | None:
    """Epoch ms of a RESTORE's timestamp parameter (UTC when it names no zone)."""
    try:
        when = datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def restored_version(commit: dict[str, Any], by_version: dict[int, dict[str, Any]]) -> int | None:
    """The version a RESTORE commit went back to (by its version, else its timestamp)."""
    params = commit.get("operationParameters") or {}
    raw = params.get("version")
    if raw is not None and str(raw).strip().lstrip("-").isdigit():
        return int(raw)
    stamp = _stamp(str(params.get("timestamp") or params.get("datetime") or ""))
    if stamp is None:
        return None
    older = [v for v, c in by_version.items() if int(c.get("timestamp", 0)) <= stamp]
    return max(older) if older else -1


def check_lineage(dt: DeltaTable, where: str, own: int) -> None:
    """Raise :class:`RestoredPastSink` if the table's current state no longer descends from
    version ``own`` (the sink's last batch commit): a RESTORE after it went back before it.

    Follows RESTOREs from the newest version back (a RESTORE at X to V skips X-1 … V+1).
    """
    latest = dt.version()
    if latest <= own:
        return
    by_version = {int(c["version"]): c for c in dt.history(latest - own + 1)}
    cur = latest
    while cur > own:
        commit = by_version.get(cur)
        if commit is None:  # the log was cleaned past it: nothing more to follow
            return
        if commit.get("operation") != "RESTORE":
            cur -= 1
            continue
        target = restored_version(commit, by_version)
        if target is None or target < own:
            batch = by_version.get(own, {}).get(BATCH_KEY, "?")
            back = "an unknown version" if target is None else f"version {target}"
            raise RestoredPastSink(
                f"{where}: version {cur} (RESTORE, by {commit.get('engineInfo', 'an engine')}) "
                f"took the table back to {back}, before the sink's batch {batch} (version "
                f"{own}): its rows are gone while the sink's state and checkpoint count them. "
                f"RESTORE the table to version {own} or later to continue, or start a new "
                "--output with a new --checkpoint"
            )
        cur = target


def check_shared(dt: DeltaTable, kind: TableKind, where: str, uri: str) -> None:
    """Raise if another writer's commits left a table the sink cannot continue to commit to.

    Raises:
        NotPidfenceTable: the table's pidfence marker was replaced.
        SchemaChanged: a column the sink writes was removed or retyped.
        RestoredPastSink: a RESTORE went back before the sink's last batch.
    """
    check_marker(dt, kind, where)
    own = last_own_version(dt, uri)
    problems = schema_problems(table_schema(dt), schema_of(kind))
    if problems:
        raise schema_changed(dt, where, problems, own)
    if own is not None:
        check_lineage(dt, where, own)


__all__ = [
    "BATCH_KEY",
    "QUERY_KEY",
    "check_lineage",
    "check_shared",
    "is_batch_commit",
    "last_own_version",
    "remember_own",
    "restored_version",
]
