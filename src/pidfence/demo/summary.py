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


def collect(run: DemoRecord) -> dict[str, Any]:
    """Read ledgers, the raw topic, the output log and rejects; run the checker; summarise."""
    from pidfence.demo.topic import read_topic
    from pidfence.spark_sink import read_log, read_rejects
    from pidfence.verify.check import check
    from pidfence.verify.downstream import truth_from_ledger, unique_users_per_minute

    paths, ends, produced = run.paths, run.endpoints, run.produced
    ledgers = ledger_entries(paths.ledgers)
    everything = [e for entries in ledgers.values() for e in entries]
    log = read_log(ends.output)
    rejects = read_rejects(ends.output)
    raw = read_topic(ends.bootstrap, ends.raw_topic)
    report = check(everything, log, rejects)
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
        if copier["missing"] or copier["duplicated"]:
            anomalies["copier_missing"] = copier["missing"]
            anomalies["copier_duplicated"] = copier["duplicated"]

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
        "examples": anomaly_examples(report),
        "copier": copier,
        "faults": {name: list(events) for name, events in faults.events.items()},
        "faults_happened": dict(faults.happened),
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
