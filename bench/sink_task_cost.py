"""The pidfence sink's own cost per record inside a task, without Spark (issue 15).

Builds bench-shaped Kafka rows (250 producers in one partition, 5% resends, 64-byte values,
125,000 records: one partition's share of a 500,000-record trigger), runs three batches to reach
the steady state, then times ``process_partition`` plus the Parquet writes of its log and rejects
(and, as the Delta layout does, of the part's decisions file) on the fourth, from a copy of the
same state each repeat. Prints the best and median nanoseconds per record; what a Spark task adds
on top (Arrow transfer from the JVM) is the no-op writer's share in ``pidfence bench sink``.

    .venv/bin/python bench/sink_task_cost.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from pidfence.broker_plugin import ProducerStateTable
from pidfence.spark_sink.decisions import decided_rows
from pidfence.spark_sink.partition_batch import process_partition
from pidfence.spark_sink.state import PartitionState
from pidfence.spark_sink.storage import write_parquet
from pidfence.wire import encode_pf

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
RECORDS = 125_000
PRODUCERS = 250
DUP_RATE = 0.05
ARROW_BATCH = 100_000


def kafka_rows(batch: int, next_seq: list[int], rng: random.Random) -> pa.Table:
    """One batch of one partition as the Kafka source hands it over (two Arrow chunks)."""
    pids = np.random.default_rng(batch).integers(1, PRODUCERS + 1, size=RECORDS).tolist()
    headers, keys = [], []
    for pid in pids:
        if next_seq[pid] and rng.random() < DUP_RATE:
            seq = next_seq[pid] - 1 - rng.randrange(min(3, next_seq[pid]))
        else:
            seq = next_seq[pid]
            next_seq[pid] += 1
        headers.append([{"key": "pf", "value": encode_pf(pid * 4, 7, seq)}])
        keys.append(b"%d:%d" % (pid, seq))
    first = batch * RECORDS
    table = pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([b"x" * 64] * RECORDS, pa.binary()),
            "topic": pa.array(["t"] * RECORDS, pa.string()),
            "partition": pa.array([0] * RECORDS, pa.int32()),
            "offset": pa.array(range(first, first + RECORDS), pa.int64()),
            "timestamp": pa.array(
                np.arange(RECORDS, dtype=np.int64) + 1_700_000_000_000_000 + first * 10
            ).cast(pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([0] * RECORDS, pa.int32()),
            "headers": pa.array(headers, HEADERS_TYPE),
        }
    )
    return pa.Table.from_batches(table.to_batches(max_chunksize=ARROW_BATCH))


def main() -> None:
    """Measure and print the cost per record."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--compression",
        default="snappy",
        help="codec of the log and rejects (the sink writes snappy, as Delta readers expect)",
    )
    args = parser.parse_args()
    rng = random.Random(1)
    next_seq = [0] * (PRODUCERS + 1)
    tables = [kafka_rows(b, next_seq, rng) for b in range(4)]
    state = PartitionState(ProducerStateTable(capacity=100_000, lifetime_ms=365 * 86_400_000))
    for table in tables[:3]:
        process_partition(table, "t", 0, state)
    snapshot = copy.deepcopy(state)
    fs = pafs.LocalFileSystem()
    seconds: list[float] = []
    decisions: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            st = copy.deepcopy(snapshot)
            start = time.perf_counter()
            out = process_partition(tables[3], "t", 0, st)
            write_parquet(out.log, f"{tmp}/log.parquet", fs, args.compression)
            write_parquet(out.rejects, f"{tmp}/rejects.parquet", fs, args.compression)
            seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
            write_parquet(decided_rows(out.log, out.rejects), f"{tmp}/decided.parquet", fs)
            decisions.append(time.perf_counter() - start)
    for what, times in (
        (f"process_partition + Parquet log and rejects ({args.compression})", seconds),
        ("the Delta layout's decisions file on top", decisions),
    ):
        best, median = min(times) / RECORDS * 1e9, statistics.median(times) / RECORDS * 1e9
        print(
            f"{what}, {RECORDS:,} records: best {best:.0f} ns, median {median:.0f} ns per record "
            f"({args.repeat} repeats)"
        )


if __name__ == "__main__":
    main()
