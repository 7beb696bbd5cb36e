"""Exactly once per event (DESIGN §9): every acknowledged event appended once, whatever the
pid, generation or seq it travelled under."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Final

from pidfence.ledger import LedgerEntry, value_digest
from pidfence.verify.finding import Finding

Identity = tuple[int, str, int, int]
#: Set on a log row another writer changed after the sink appended it (``updated``): the digest
#: of the value the sink wrote, by which the row is judged.
WRITTEN_DIGEST: Final = "_written_digest"


def identity(row: Mapping[str, Any]) -> Identity:
    """(pid, topic, partition, seq) of a log or rejects row."""
    return (int(row["pid"]), str(row["topic"]), int(row["partition"]), int(row["seq"]))


def row_digest(row: Mapping[str, Any]) -> str:
    """The digest of the value the sink appended in a log row (for an ``updated`` row, what it
    wrote rather than what another writer changed it to)."""
    written = row.get(WRITTEN_DIGEST)
    return str(written) if written is not None else value_digest(row["value"])


def _row_events(
    data: list[LedgerEntry], log_rows: list[dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """``(event, row)`` per appended idempotent row, in (topic, partition, log_offset) order.

    A row no ledger line names (its acknowledgement never recorded, or a pid in no ledger)
    carries an event acknowledged with its digest. When several events share the digest (equal
    bytes under explicit event ids), such rows fill first the events that have no named copy
    (which one does not matter: the bytes are the same); a row left over after every one of them
    has a copy is an extra copy of one of them, so a duplicate however it is assigned.
    """
    by_record: dict[tuple[Identity, str], str] = {}
    by_digest: dict[str, set[str]] = defaultdict(set)
    for entry in data:
        event = entry.event_id
        by_record[((entry.pid, entry.topic, entry.partition, entry.seq), entry.digest)] = event
        by_digest[entry.digest].add(event)
    rows = [r for r in log_rows if r["pid"] != 0]
    rows.sort(key=lambda r: (r["topic"], r["partition"], r["log_offset"]))
    named: list[str | None] = []
    has_copy: set[str] = set()
    for row in rows:
        known = by_record.get((identity(row), row_digest(row)))
        named.append(known)
        if known is not None:
            has_copy.add(known)
    out = []
    for row, known in zip(rows, named, strict=True):
        carried = known
        if carried is None:
            digest = row_digest(row)
            candidates = sorted(by_digest.get(digest, ()))
            bare = [e for e in candidates if e not in has_copy]
            carried = bare[0] if bare else candidates[0] if candidates else digest
            has_copy.add(carried)
        out.append((carried, row))
    return out


def events_in_log(data: list[LedgerEntry], log_rows: list[dict[str, Any]]) -> set[str]:
    return {event for event, _ in _row_events(data, log_rows)}


def check_events(
    data: list[LedgerEntry],
    log_rows: list[dict[str, Any]],
    duplicate: Finding,
    lost: Finding,
    deleted: set[str] | None = None,
) -> int:
    """DESIGN §9: every acknowledged event appended exactly once, whatever its identities
    (``deleted``: events appended, then deleted from the output after commit).

    Returns the number of distinct acknowledged events.
    """
    sends: dict[str, list[LedgerEntry]] = defaultdict(list)
    for entry in data:
        sends[entry.event_id].append(entry)
    appended: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event, row in _row_events(data, log_rows):
        copies = appended[event]
        copies.append(row)
        if len(copies) == 2:
            duplicate.add({"event": event, "copies": [_identity_text(r) for r in copies]})
        elif len(copies) > 2:
            duplicate.count += 1
            if duplicate.examples and duplicate.examples[-1]["event"] == event:
                duplicate.examples[-1]["copies"].append(_identity_text(row))
    for event, entries in sends.items():
        if event in appended or event in (deleted or set()):
            continue
        lost.add(
            {
                "event": event,
                "sent_as": sorted({_entry_text(e) for e in entries})[:4],
            }
        )
    return len(sends)


def _identity_text(row: Mapping[str, Any]) -> str:
    return (
        f"pid={row['pid']} g={row['generation']} {row['topic']}[{row['partition']}] "
        f"seq={row['seq']} log_offset={row['log_offset']}"
    )


def _entry_text(entry: LedgerEntry) -> str:
    return f"pid={entry.pid} g={entry.generation} {entry.topic}[{entry.partition}] seq={entry.seq}"
