"""The checker (DESIGN §8): compares the send ledger with the output log and the rejects log.

A pure function over pyarrow tables and ledger entries. Records are identified by
``(pid, topic, partition, seq)``; values are compared by :func:`value_digest`.

Anomalies (each must be 0 for a run to pass):

* ``lost``: acknowledged by Kafka (ledger entry with ``fence=False``) yet not in the log with the
  same digest, and not rejected as ``FENCED`` with the same generation and digest (a zombie's
  write), nor a row of the sink's own account removed after a row-removing commit (``deleted``).
  A ``DUPLICATE`` reject needs no rule of its own: it is only excused when its original is
  in the log, which the first check sees. An identity acknowledged under several generations (a
  zombie and its replacement) is judged once per (generation, digest).
* ``duplicate``: one identity appears more than once in the log.
* ``reordered``: within (topic, partition, pid), in ``log_offset`` order, a seq not greater than
  the one before it (equal seqs are reported as ``duplicate`` only); a record the sink reported
  as filling an open hole late (``filled``) is not.
* ``zombie``: a record of generation g appended after a record or ``FENCE`` of the same pid with a
  generation > g reached that partition (Kafka ``offset`` order of log + rejects).
* ``unexpected``: in the log with pid != 0 under an identity the ledger has with another digest.
* ``event_duplicate`` (DESIGN §9): one upstream event appended more than once, under any
  identities (a zombie that re-sent its work under a fresh pid shows up here and nowhere else).
* ``event_lost`` (DESIGN §9): an acknowledged event with no appended copy at all.

Events: a ledger entry's ``event_id`` (the producer's ``event_id``, else the value digest: with
default ids, distinct sends of equal bytes are one event). A log row carries the event of the
ledger entry with its identity and digest; a row the ledger does not name (an acknowledgement a
crash lost, or a pid in no ledger) carries an event acknowledged with its digest (several events
sharing the digest: one with no other copy first, else it is an extra copy of one of them), else
the digest itself (:mod:`pidfence.verify.events`).

Informational counts (never fail a run by themselves):

* ``expired``: acknowledged records the broker refused because their lease had ended (ledger
  ``ts_ms >= expire_ms > 0``: a lease ends at its ``expire_ms``; verdict ``UNKNOWN_PID`` or
  ``OUT_OF_ORDER``): the proposal says a client never uses an expired pid, so these are the
  producer's own late writes. Such a record is not ``lost``, but its event still counts: an
  expired record whose event has no appended copy is also ``event_lost``, which fails the run.
* ``unacknowledged``: in the log but not acknowledged: a producer killed after Kafka wrote the
  record but before the ledger recorded the ack (a resumer that finds it in Kafka does not re-send
  it, so its seq may be below acknowledged ones, or its pid in no ledger at all).
* ``superseded``: an acknowledged record the rules dropped (say ``OUT_OF_ORDER`` behind a gap its
  dead predecessor never filled) whose event reached the log under another identity: a resume
  re-sent it; per event nothing is lost. Only the same event excuses it: with an explicit event
  id (``produce(..., event_id=...)``, the copier's upstream position) a logged row of that event;
  with the default id (the value digest, which distinct sends of equal bytes share) only a logged
  copy of those bytes that no other acknowledged record accounts for (a resend whose own
  acknowledgement was never recorded). Give event ids to prove a resume across pids.
* ``foreign``: rows another writer appended to a shared (Delta) output, copies of the sink's rows
  included (a copy the sink's own account lists twice, or one in a data file the sink's commits
  added, is the sink's: ``duplicate``), and rows
  without an identity (a null pid, topic, partition, seq, generation or offset; in the rejects a
  null verdict too); they are not judged (:mod:`pidfence.verify.provenance`).
* ``deleted``: records the sink appended (its own account, ``written``) that the output no
  longer holds and that the table's history shows a row-removing commit after (a DELETE, MERGE,
  UPDATE, RESTORE, an overwrite: :mod:`pidfence.verify.removals`; retention, GDPR): neither lost
  nor re-appended. Without such a commit in the history the record is ``lost``.
* ``updated``: records the sink appended whose value another writer changed in place after
  the sink's commit (an UPDATE or MERGE in the table's history after it, the row still where
  the sink put it with its identity): judged by the value the sink wrote, so neither ``lost``
  nor ``unexpected``. Without such a commit a changed value is ``unexpected`` (and ``lost``).
* ``torn``: ledger lines a writer killed mid-line left (``file:line``); their acknowledgements
  were never fully recorded, so their records are not claimed as sent
  (:mod:`pidfence.verify.ledger_input`).
* ``upstream_gap``: a gap the sink reported (DESIGN §4 amended again) with its range and how many
  acknowledged records fall inside it (:mod:`pidfence.verify.gaps`); an acknowledged record
  inside a gap is still ``lost`` and its example names the gap.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from pidfence.ledger import LedgerEntry, value_digest
from pidfence.verify.errors import VerifyInputError
from pidfence.verify.events import (
    WRITTEN_DIGEST,
    Identity,
    check_events,
    events_in_log,
    identity,
    row_digest,
)
from pidfence.verify.finding import Finding
from pidfence.verify.gaps import filled, gap_of, report_gaps, seq_gaps
from pidfence.verify.ledger_input import entry_problem
from pidfence.verify.provenance import split
from pidfence.verify.removals import Changes, Removals
from pidfence.wire import Verdict

if TYPE_CHECKING:
    from rich.table import Table

#: The anomalies that fail a run, in report order.
ANOMALIES: Final = (
    "lost",
    "duplicate",
    "reordered",
    "zombie",
    "unexpected",
    "event_duplicate",
    "event_lost",
)
#: Counts shown for information only.
INFORMATIONAL: Final = (
    "expired",
    "unacknowledged",
    "superseded",
    "foreign",
    "deleted",
    "updated",
    "torn",
    "upstream_gap",
)

LOG_COLUMNS: Final = (
    "topic",
    "partition",
    "log_offset",
    "pid",
    "generation",
    "seq",
    "key",
    "value",
    "offset",
    "timestamp",
)
REJECT_COLUMNS: Final = (*LOG_COLUMNS, "verdict")


# Verdicts that move a partition's known generation forward (DESIGN §4 state changes).
_GENERATION_WITNESSES: Final = frozenset({Verdict.FENCE.value, Verdict.DUPLICATE.value})
_EXPIRY_VERDICTS: Final = frozenset({Verdict.UNKNOWN_PID.value, Verdict.OUT_OF_ORDER.value})
# Columns a row needs to be judged (a row lacking one was not written by the sink's rules).
_LOG_IDENTITY: Final = ("pid", "topic", "partition", "seq", "generation", "log_offset", "offset")
_REJECT_IDENTITY: Final = ("pid", "topic", "partition", "seq", "generation", "offset", "verdict")


@dataclass(slots=True)
class CheckReport:
    """What :func:`check` found.

    Attributes:
        findings: one :class:`Finding` per name in ``ANOMALIES`` and ``INFORMATIONAL``.
        totals: sizes of the inputs (``ledger``, ``log``, ``rejects``).
    """

    findings: dict[str, Finding]
    totals: dict[str, int]

    @property
    def ok(self) -> bool:
        """True when every anomaly count is 0 (informational counts do not matter)."""
        return all(self.findings[name].count == 0 for name in ANOMALIES)

    def counts(self) -> dict[str, int]:
        """Every count by name."""
        return {name: finding.count for name, finding in self.findings.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``ok``, ``totals``, per finding ``count`` and ``examples``)."""
        return {
            "ok": self.ok,
            "totals": dict(self.totals),
            "findings": {
                name: {"count": f.count, "examples": f.examples}
                for name, f in self.findings.items()
            },
        }

    def render(self) -> Table:
        """A rich table: one row per anomaly and informational count, with up to 10 examples."""
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"pidfence verify: {self.summary()}", show_lines=True)
        table.add_column("anomaly")
        table.add_column("count", justify="right")
        table.add_column("examples")
        for name, finding in self.findings.items():
            informational = name in INFORMATIONAL
            style = "dim" if informational else ("red" if finding.count else "green")
            label = f"{name} (info)" if informational else name
            examples = "\n".join(_one_line(e) for e in finding.examples)
            # Text, not a markup string: examples hold brackets (verdict lists) rich would eat.
            table.add_row(label, str(finding.count), Text(examples), style=style)
        totals = ", ".join(f"{k}={v}" for k, v in self.totals.items())
        table.caption = f"inputs: {totals}"
        return table

    def summary(self) -> str:
        """One line: ``ok`` or the non-zero anomaly counts."""
        bad = {n: self.findings[n].count for n in ANOMALIES if self.findings[n].count}
        return "ok" if not bad else ", ".join(f"{n}={c}" for n, c in bad.items())


def check(
    ledger: Iterable[LedgerEntry],
    log: pa.Table,
    rejects: pa.Table,
    written: pa.Table | None = None,
    gaps: pa.Table | None = None,
    history: Iterable[Mapping[str, Any]] | None = None,
    torn: Sequence[str] = (),
    in_own_files: Sequence[bool] | None = None,
) -> CheckReport:
    """Compare acknowledged sends with the output log and the rejects (DESIGN §8).

    Args:
        ledger: acknowledged records (any order; a resent record may appear twice).
        log: the output log, columns ``LOG_COLUMNS`` (extra columns are ignored).
        rejects: the rejects log, columns ``REJECT_COLUMNS``.
        written: the rows the sink itself appended (``pidfence.spark_sink.read_written``), for
            an output other writers share: rows of others are counted as ``foreign``, written
            rows no longer in ``log`` as ``deleted`` when ``history`` shows a commit after
            theirs that removes rows, else as ``lost``; None judges every log row.
        gaps: the gaps the sink reported (``pidfence.spark_sink.read_gaps``), if any.
        history: the log table's ``DeltaTable.history()`` (with ``written``); None is no
            history, so no missing row is excused as deleted.
        torn: ``file:line`` of each torn ledger line (counted as ``torn``).
        in_own_files: with ``written``, per ``log`` row whether it is in a data file the
            sink's commits added: every row there is the sink's, copies beyond its account
            included (judged, so a ``duplicate``), not ``foreign``.

    Returns:
        The report; ``report.ok`` is the pass/fail answer.

    Raises:
        VerifyInputError: a table lacks a required column, or a ledger entry a field of the
            wrong type (the message names it).
    """
    findings = {name: Finding() for name in (*ANOMALIES, *INFORMATIONAL)}
    for where in torn:
        findings["torn"].add({"line": where})
    deleted: set[tuple[Identity, int]] = set()
    vanished: dict[tuple[Identity, int], int | None] = {}
    changes: Changes | None = None
    if written is not None:
        _need(
            log, ("topic", "partition", "log_offset", "offset", "pid", "generation", "seq"), "log"
        )
        parts = split(log, written, in_own_files)
        log = parts.own
        for row in _rows(parts.foreign, (), "log"):
            findings["foreign"].add(_example(row))
        removals = Removals(history or ())
        changes = Changes(removals, written)
        for row in parts.deleted.to_pylist():
            batch = None if row.get("batch") is None else int(row["batch"])
            key = (identity(row), int(row["generation"]))
            by = removals.after(batch)
            if by is None:
                vanished[key] = batch  # gone with no commit that removes rows: lost
                continue
            findings["deleted"].add({**_example(row), "removed_by": f"version {by[0]} ({by[1]})"})
            deleted.add(key)
    log_rows, foreign = _judged(_rows(log, LOG_COLUMNS, "log"), _LOG_IDENTITY)
    for row in foreign:
        findings["foreign"].add({**_example(row), "why": "no identity"})
    reject_rows, foreign = _judged(_rows(rejects, REJECT_COLUMNS, "rejects"), _REJECT_IDENTITY)
    for row in foreign:  # the sink sets every one of these columns on every row it writes
        findings["foreign"].add({**_example(row), "table": "rejects", "why": "no identity"})

    # One identity may be acknowledged more than once: a resend, or a zombie and its replacement
    # sending the same seq under two generations. Each distinct (generation, digest) is judged.
    acked: dict[Identity, dict[tuple[int, str], LedgerEntry]] = defaultdict(dict)
    top_acked: dict[tuple[int, str, int], int] = {}
    ledger_pids: set[int] = set()
    data: list[LedgerEntry] = []
    n_ledger = 0
    for entry in ledger:
        n_ledger += 1
        problem = entry_problem(entry)
        if problem is not None:
            raise VerifyInputError(f"ledger entry {n_ledger} is not a ledger entry: {problem}")
        ledger_pids.add(entry.pid)
        if entry.fence:
            continue
        data.append(entry)
        ident = (entry.pid, entry.topic, entry.partition, entry.seq)
        acked[ident].setdefault((entry.generation, entry.digest), entry)
        stream = ident[:3]
        top_acked[stream] = max(top_acked.get(stream, -1), entry.seq)

    in_log: dict[Identity, str] = {}
    seen = Counter[Identity]()
    for row in log_rows:
        if row["pid"] == 0:
            continue
        ident = identity(row)
        digest = value_digest(row["value"])
        sent = acked.get(ident)
        if sent is not None and changes is not None and all(d != digest for _, d in sent):
            change = changes.of(row, sent)
            if change is not None:
                # Changed by another writer after the sink wrote it: judged as it was written.
                row[WRITTEN_DIGEST] = digest = change[0]
                findings["updated"].add({**_example(row), "changed_by": change[1]})
        seen[ident] += 1
        if seen[ident] == 2:
            findings["duplicate"].add(_example(row))
        elif seen[ident] > 2:
            findings["duplicate"].count += 1
        in_log.setdefault(ident, digest)
        if sent is not None:
            if all(d != digest for _, d in sent):
                findings["unexpected"].add({**_example(row), "why": "digest differs from ledger"})
        elif row["pid"] not in ledger_pids:
            # A producer killed before its first acknowledgement was recorded (its resumer found
            # the record in Kafka and did not re-send it). A foreign writer looks the same here;
            # signing (FORGED) is what refuses those.
            findings["unacknowledged"].add({**_example(row), "why": "pid in no ledger"})
        else:
            # A record whose acknowledgement nobody recorded (a process killed between Kafka's
            # write and its ledger line); a resumer that found it in Kafka does not re-send it.
            below = row["seq"] <= top_acked.get(ident[:3], -1)
            findings["unacknowledged"].add({**_example(row), "below_acknowledged": below})

    # (verdict, generation, digest) per identity: a FENCED reject excuses only the very record
    # that was fenced, not a replacement's send of the same seq under a newer generation.
    rejected: dict[Identity, set[tuple[str, int, str]]] = defaultdict(set)
    for row in reject_rows:
        rejected[identity(row)].add(
            (str(row["verdict"]), int(row["generation"]), value_digest(row["value"]))
        )

    in_gaps = seq_gaps(gaps)
    logged_events = events_in_log(data, log_rows)
    spare = _spare_copies(data, log_rows)
    for ident, sends in acked.items():
        logged = in_log.get(ident)
        drops = rejected.get(ident, set())
        for (generation, digest), entry in sends.items():
            if logged == digest or (Verdict.FENCED.value, generation, digest) in drops:
                continue
            if (ident, generation) in deleted:
                continue  # appended, then deleted by the output's owner: counted as deleted
            verdicts = {v for v, g, d in drops if g == generation and d == digest}
            example = {
                "pid": entry.pid,
                "generation": entry.generation,
                "topic": entry.topic,
                "partition": entry.partition,
                "seq": entry.seq,
                "offset": entry.offset,
                "verdicts": sorted(verdicts),
            }
            if 0 < entry.expire_ms <= entry.ts_ms and verdicts & _EXPIRY_VERDICTS:
                findings["expired"].add(example)
            elif verdicts and _same_event_logged(entry, logged_events, spare):
                # The rules dropped it (a gap its predecessor never filled, ...) and a resume
                # re-sent its event under another identity: per event, nothing is lost.
                findings["superseded"].add({**example, "event": entry.event_id})
            else:
                gap = gap_of(in_gaps, ident)
                if gap is not None:
                    example["in_gap"] = gap
                if (ident, generation) in vanished:
                    example["why"] = (
                        f"the sink wrote it (batch {vanished[ident, generation]}); gone from "
                        "the table with no commit after it that removes rows"
                    )
                findings["lost"].add(example)

    report_gaps(gaps, acked, findings["upstream_gap"])
    _check_order(log_rows, findings["reordered"], filled(gaps))
    _check_zombies(log_rows, reject_rows, findings["zombie"])
    gone = {
        e.event_id for e in data if ((e.pid, e.topic, e.partition, e.seq), e.generation) in deleted
    }
    events = check_events(data, log_rows, findings["event_duplicate"], findings["event_lost"], gone)
    return CheckReport(
        findings,
        {
            "ledger": n_ledger,
            "log": len(log_rows),
            "rejects": len(reject_rows),
            "events": events,
        },
    )


def _spare_copies(data: list[LedgerEntry], log_rows: list[dict[str, Any]]) -> Counter[str]:
    """Per digest, the logged copies that no acknowledged record accounts for under its own
    identity: the only copies that can be another identity's re-send of a dropped record with
    the default event id (distinct sends of equal bytes each account for their own copy)."""
    accounted = {(e.pid, e.topic, e.partition, e.seq, e.digest) for e in data}
    spare = Counter[str]()
    for row in log_rows:
        if row["pid"] != 0:
            digest = row_digest(row)
            if (*identity(row), digest) not in accounted:
                spare[digest] += 1
    return spare


def _explicit(entry: LedgerEntry) -> bool:
    """Whether the producer named the event (the ledger writes the digest when it did not)."""
    return bool(entry.event) and entry.event != entry.digest


def _same_event_logged(entry: LedgerEntry, logged: set[str], spare: Counter[str]) -> bool:
    """Whether a logged row carries ``entry``'s own event (a spare copy is used up once)."""
    if _explicit(entry):
        return entry.event in logged
    if spare[entry.digest] > 0:
        spare[entry.digest] -= 1
        return True
    return False


def _judged(
    rows: list[dict[str, Any]], columns: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``rows`` split into those with every identity column set (every row the sink writes,
    non-idempotent ones with pid 0 included) and the rest, another writer's."""
    good, bad = [], []
    for row in rows:
        if all(row.get(c) is not None for c in columns):
            good.append(row)
        else:
            bad.append(row)
    return good, bad


def _check_order(log_rows: list[dict[str, Any]], finding: Finding, late: set[Identity]) -> None:
    last: dict[tuple[int, str, int], int] = {}
    for row in sorted(log_rows, key=lambda r: (r["topic"], r["partition"], r["log_offset"])):
        if row["pid"] == 0 or identity(row) in late:
            continue
        stream = identity(row)[:3]
        before = last.get(stream)
        if before is not None and row["seq"] < before:
            finding.add({**_example(row), "after_seq": before})
        last[stream] = max(row["seq"], before if before is not None else -1)


def _check_zombies(
    log_rows: list[dict[str, Any]], reject_rows: list[dict[str, Any]], finding: Finding
) -> None:
    events = [(r, True) for r in log_rows if r["pid"] != 0]
    events += [(r, False) for r in reject_rows if str(r["verdict"]) in _GENERATION_WITNESSES]
    events.sort(key=lambda e: (e[0]["topic"], e[0]["partition"], e[0]["offset"], not e[1]))
    newest: dict[tuple[int, str, int], int] = {}
    for row, appended in events:
        stream = identity(row)[:3]
        top = newest.get(stream, -1)
        if appended and row["generation"] < top:
            finding.add({**_example(row), "fenced_by_generation": top})
        newest[stream] = max(top, row["generation"])


def _one_line(example: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in example.items())


def _example(row: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("topic", "partition", "log_offset", "pid", "generation", "seq", "offset")
    return {k: row[k] for k in keys if k in row}


def _need(table: pa.Table, columns: tuple[str, ...], name: str) -> None:
    missing = [c for c in columns if c not in table.column_names and c not in ("key", "timestamp")]
    if missing:
        raise VerifyInputError(
            f"{name} table lacks column(s) {missing}; expected {list(columns)} "
            "(read it with pidfence.spark_sink.read_log / read_rejects)"
        )


def _rows(table: pa.Table, columns: tuple[str, ...], name: str) -> list[dict[str, Any]]:
    """The rows as dicts of ``columns`` (every column but key and timestamp when empty)."""
    if not columns:
        columns = tuple(c for c in table.column_names if c not in ("key", "timestamp"))
    _need(table, columns, name)
    wanted = [c for c in columns if c in table.column_names and c not in ("key", "timestamp")]
    data = {c: table.column(c).to_pylist() for c in wanted}
    return [dict(zip(wanted, values, strict=True)) for values in zip(*data.values(), strict=True)]
