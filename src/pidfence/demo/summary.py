"""Collect what the demo produced into one JSON-able summary: counts, verdicts, anomalies."""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pidfence.demo.record import DemoRecord
from pidfence.ledger import LedgerEntry, read_ledger, value_digest
from pidfence.verify.check import ANOMALIES, INFORMATIONAL, CheckReport
from pidfence.wire import PidfenceError

_INSTANCE = re.compile(r"\.r\d+$")


def producer_of(instance: str) -> str:
    """``p1.r2`` -> ``p1``: the logical producer of an instance name."""
    return _INSTANCE.sub("", instance)


def ledger_entries(folder: Path) -> dict[str, list[LedgerEntry]]:
    """Entries per instance name from every ``*.jsonl`` directly in ``folder``."""
    return {path.stem: list(read_ledger([path])) for path in sorted(folder.glob("*.jsonl"))}


def pid_owners(ledgers: dict[str, list[LedgerEntry]]) -> dict[int, str]:
    """pid -> logical producer name (a pid belongs to one producer; restarts keep or bump it)."""
    owners: dict[int, str] = {}
    for instance, entries in ledgers.items():
        for entry in entries:
            owners.setdefault(entry.pid, producer_of(instance))
    return owners


def verdicts_per_producer(
    log: pa.Table, rejects: pa.Table, owners: dict[int, str]
) -> dict[str, dict[str, int]]:
    """``{producer: {verdict: count}}`` with APPENDED from the log and drops from the rejects."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for pid in log.column("pid").to_pylist():
        table[owners.get(pid, "other")]["APPENDED"] += 1
    for pid, verdict in zip(
        rejects.column("pid").to_pylist(), rejects.column("verdict").to_pylist(), strict=True
    ):
        table[owners.get(pid, "other")][str(verdict)] += 1
    return {name: dict(sorted(counts.items())) for name, counts in sorted(table.items())}


def epoch_ms(column: pa.ChunkedArray | pa.Array) -> list[int]:
    """Epoch milliseconds of a timestamp column (the log's ``TIMESTAMP``) or an int64 one."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
    return [int(v) for v in column.to_pylist() if v is not None]


def cumulative_per_second(timestamps: list[int], start_ms: int) -> list[tuple[float, int]]:
    """(seconds since ``start_ms``, records so far) at each second with records."""
    per_second = Counter((ts - start_ms) // 1000 for ts in timestamps)
    points, total = [], 0
    for second in sorted(per_second):
        total += per_second[second]
        points.append((float(second), total))
    return points


def copier_exactly_once(upstream: pa.Table, log: pa.Table) -> dict[str, int]:
    """Every upstream value appears exactly once in the output log (values are unique upstream).

    Returns ``{"upstream": n, "copied_once": a, "missing": b, "duplicated": c}``.
    """
    wanted = Counter(value_digest(v) for v in upstream.column("value").to_pylist())
    seen = Counter(
        d for d in (value_digest(v) for v in log.column("value").to_pylist()) if d in wanted
    )
    return {
        "upstream": len(wanted),
        "copied_once": sum(1 for d in wanted if seen[d] == 1),
        "missing": sum(1 for d in wanted if seen[d] == 0),
        "duplicated": sum(1 for d in wanted if seen[d] > 1),
    }


def anomaly_counts(report: CheckReport) -> dict[str, int]:
    """``{anomaly: count}`` for the anomalies that fail a run."""
    return {name: report.findings[name].count for name in ANOMALIES}


def informational_counts(report: CheckReport) -> dict[str, int]:
    """Counts the checker reports that never fail a run (``expired``, ``unacknowledged``)."""
    return {name: report.findings[name].count for name in INFORMATIONAL}


def anomaly_examples(report: CheckReport) -> dict[str, list[str]]:
    """Up to 10 examples per non-zero anomaly, as strings."""
    return {
        name: [str(e) for e in report.findings[name].examples]
        for name in ANOMALIES
        if report.findings[name].count
    }


def minutes(table: pa.Table) -> dict[str, list[int]]:
    """``unique_users_per_minute`` output as ``{"HH:MM": [users, events]}`` (UTC minutes)."""
    out: dict[str, list[int]] = {}
    for minute, users, events in zip(
        table.column("minute").to_pylist(),
        table.column("users").to_pylist(),
        table.column("events").to_pylist(),
        strict=True,
    ):
        label = time.strftime("%Y-%m-%d %H:%M", time.gmtime(minute / 1000))
        out[label] = [int(users), int(events)]
    return out


class CheckerCannotRun(PidfenceError):
    """The checker could not read what the run left (no ledger at all, the output missing)."""


def missing_faults(happened: dict[str, bool]) -> list[str]:
    """The requested faults that did not happen (their script ran out without striking)."""
    return sorted(name for name, done in happened.items() if not done)


def rolled_over(ledgers: dict[str, list[LedgerEntry]], producers: set[str], skip: str) -> bool:
    """Whether a producer rolled over to a new pid: one of ``producers`` other than ``skip``
    (the lease-zombie's victim, whose replacement may write under a successor pid without a
    rollover) wrote under more than one pid; with no other producer, whether the producers used
    more pids than there are producers."""
    pids: dict[str, set[int]] = defaultdict(set)
    for instance, entries in ledgers.items():
        if (name := producer_of(instance)) in producers:
            pids[name].update(e.pid for e in entries)
    others = producers - {skip}
    if others:
        return any(len(pids[name]) > 1 for name in others)
    return len(set().union(*pids.values())) > len(producers)


def events_not_sent(
    ledgers: dict[str, list[LedgerEntry]], producers: set[str], records: int
) -> dict[str, int]:
    """Per producer, how many of its ``records`` events no instance got acknowledged (the plan
    has every producer send all of them, however often it is killed, paused or replaced)."""
    events: dict[str, set[str]] = {name: set() for name in producers}
    for instance, entries in ledgers.items():
        if (name := producer_of(instance)) in events:
            events[name].update(e.event_id for e in entries if not e.fence)
    return {
        name: records - len(seen) for name, seen in sorted(events.items()) if len(seen) < records
    }


def run_checker(ledger_folder: Path, output: str) -> CheckReport:
    """:func:`pidfence.verify.output.verify_output` over the run's ledger folder and output
    (the checker ``pidfence verify`` runs, with its guards: an empty ledger folder is refused,
    not judged).

    Raises:
        CheckerCannotRun: the ledger folder holds no ledger, or the output is missing.
    """
    from pidfence.verify.errors import VerifyInputError
    from pidfence.verify.output import verify_output

    try:
        return verify_output([ledger_folder], output)
    except VerifyInputError as exc:
        raise CheckerCannotRun(f"the checker cannot run: {exc}") from exc


def collect(run: DemoRecord) -> dict[str, Any]:
    """Read ledgers, the raw topic, the output log and rejects; run the checker; summarise.

    Besides the checker's anomalies, the verdict fails on ``fault_missing`` (a requested fault
    that did not happen: ``rollover`` when no producer rolled to a new pid), ``events_not_sent``
    (events of ``--records`` no producer instance got acknowledged), ``process_crashed`` (a
    producer or copier that crashed on its own), ``copier_upstream_short`` (fewer upstream
    records than ``--copier-records``) and the copier and downstream checks.
    """
    from pidfence.demo.config import Fault
    from pidfence.demo.topic import read_topic
    from pidfence.spark_sink import read_log, read_rejects
    from pidfence.testing.plan import FaultKind
    from pidfence.verify.downstream import truth_from_ledger, unique_users_per_minute

    paths, ends, produced, config = run.paths, run.endpoints, run.produced, run.config
    report = run_checker(paths.ledgers, ends.output)
    ledgers = ledger_entries(paths.ledgers)
    everything = [e for entries in ledgers.values() for e in entries]
    log = read_log(ends.output)
    rejects = read_rejects(ends.output)
    raw = read_topic(ends.bootstrap, ends.raw_topic)
    anomalies = anomaly_counts(report)
    owners = pid_owners(ledgers)

    data = [e for e in everything if not e.fence]
    identities = {(e.pid, e.topic, e.partition, e.seq) for e in data}
    verdicts = Counter(str(v) for v in rejects.column("verdict").to_pylist())
    raw_fences = sum(1 for h in raw.column("pf").to_pylist() if h is not None and _is_fence(h))

    start_ms = min(epoch_ms(raw.column("timestamp")), default=0)
    copier: dict[str, int] = {}
    if produced.copier:
        upstream = read_topic(ends.bootstrap, ends.upstream_topic)
        copier = copier_exactly_once(upstream, log)
        anomalies["copier_missing"] = copier["missing"]
        anomalies["copier_duplicated"] = copier["duplicated"]
        anomalies["copier_upstream_short"] = max(0, config.copier_records - copier["upstream"])

    # The work was done: every producer's events, every requested fault.
    producers = {f"p{i}" for i in range(config.producers)}
    not_sent = events_not_sent(ledgers, producers, config.records)
    anomalies["events_not_sent"] = sum(not_sent.values())
    happened = dict(produced.faults.happened)
    if Fault.ROLLOVER in config.faults:
        victim = next((s.target for s in config.plan.of_kind(FaultKind.LEASE_ZOMBIE)), "")
        happened["rollover"] = rolled_over(ledgers, producers, victim)
    missing = missing_faults(happened)
    anomalies["fault_missing"] = len(missing)
    anomalies["process_crashed"] = len(produced.faults.crashed)

    raw_data = raw.filter(pc.fill_null(pc.greater(pc.binary_length(raw["value"]), 0), False))
    downstream = {
        "raw": minutes(unique_users_per_minute(raw_data)),
        "output_log": minutes(unique_users_per_minute(log)),
        "truth": minutes(truth_from_ledger(everything, raw)),
    }
    # The downstream job over the output log must see exactly the truth (events and users).
    log_side, truth = downstream["output_log"], downstream["truth"]
    anomalies["downstream_mismatch"] = sum(
        1 for m in set(log_side) | set(truth) if log_side.get(m) != truth.get(m)
    )
    examples = anomaly_examples(report)
    if missing:
        examples["fault_missing"] = [f"{name}: requested, did not happen" for name in missing]
    if not_sent:
        examples["events_not_sent"] = [f"{n}: {k} event(s)" for n, k in not_sent.items()][:10]
    if produced.faults.crashed:
        examples["process_crashed"] = list(produced.faults.crashed)[:10]
    workers = [*produced.instances, *produced.copier]
    faults = produced.faults
    summary: dict[str, Any] = {
        "ok": not any(anomalies.values()),
        "output": ends.output,
        "config": {
            "records": run.config.records,
            "producers": run.config.producers,
            "partitions": run.config.partitions,
            "faults": sorted(f.value for f in run.config.faults),
            "lease_lifetime": run.config.lifetime,
            "copier_records": run.config.copier_records,
        },
        "counts": {
            "sent_acknowledged": len(data),
            "sent_distinct": len(identities),
            "fences_acknowledged": sum(1 for e in everything if e.fence),
            "raw_records": raw.num_rows,
            "raw_fence_records": raw_fences,
            "appended": log.num_rows,
            "rejected": rejects.num_rows,
            "pids_used": len({e.pid for e in everything}),
        },
        "verdicts": {"APPENDED": log.num_rows, **dict(sorted(verdicts.items()))},
        "verdicts_per_producer": verdicts_per_producer(log, rejects, owners),
        "anomalies": anomalies,
        "informational": informational_counts(report),
        "examples": examples,
        "copier": copier,
        "faults": {name: list(events) for name, events in faults.events.items()},
        "faults_happened": happened,
        "zombie_writes": dict(faults.zombie_writes),
        "plan": {"seed": faults.seed, "steps": list(faults.plan)},
        "instances": {w.name: w.final_state() for w in workers},
        "phases_s": dict(run.phases),
        "sink_passes": [dict(p) for p in run.sink_passes],
        "exit_codes": {w.name: w.exit_code() for w in workers},
        "downstream": downstream,
        "timeline": {
            "raw": cumulative_per_second(epoch_ms(raw.column("timestamp")), start_ms),
            "appended": cumulative_per_second(epoch_ms(log.column("timestamp")), start_ms),
        },
    }
    return summary


def _is_fence(header: bytes) -> bool:
    from pidfence.wire import FLAG_FENCE, MalformedHeader, decode_pf

    try:
        return bool(decode_pf(header).flags & FLAG_FENCE)
    except MalformedHeader:
        return False
