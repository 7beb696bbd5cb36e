"""``pidfence bench engine``: throughput and state size of the broker rules.

An in-order stream (1M records over 1k producers, 5% duplicates; ``--quick``: 200k) is decided by
(1) ``offer_header`` record by record, (2) the batch path ``offer_batch`` in 100k-record batches
(what one Spark task sees), and (3) the naive design the proposal calls impractical: a set of every
(pid, seq) ever seen. State is measured at half and at the full stream to show that the table's
state per producer does not grow with the record count while the naive set's does.
"""

from __future__ import annotations

import gc
import random
import time
import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
from rich.progress import Progress

from pidfence.benchkit import BenchReport
from pidfence.broker_plugin import ProducerStateTable
from pidfence.wire import Verdict, decode_pf, encode_pf

PIDS = 1_000
DUP_RATE = 0.05
BATCH = 100_000


def make_stream(n: int, seed: int = 1) -> tuple[list[bytes], np.ndarray]:
    """Headers and timestamps of an in-order stream with resends."""
    rng = random.Random(seed)
    next_seq = [0] * (PIDS + 1)
    headers: list[bytes] = []
    for _ in range(n):
        pid = rng.randrange(1, PIDS + 1)
        if next_seq[pid] and rng.random() < DUP_RATE:
            seq = next_seq[pid] - 1 - rng.randrange(min(3, next_seq[pid]))
        else:
            seq = next_seq[pid]
            next_seq[pid] += 1
        headers.append(encode_pf(pid, 7, seq))
    return headers, np.arange(n, dtype=np.int64) + 1_700_000_000_000


def _timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def _state_bytes(build: Any) -> int:
    gc.collect()
    tracemalloc.start()
    obj = build()
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del obj
    return current


def run(quick: bool, progress: Progress) -> BenchReport:
    """Run the engine benchmark."""
    n = 200_000 if quick else 1_000_000
    task = progress.add_task("building stream", total=5)
    headers, ts = make_stream(n)
    arrow = pa.array(headers, type=pa.binary())
    ts_list = ts.tolist()
    half = n // 2
    progress.advance(task)

    def per_record(count: int) -> ProducerStateTable:
        table = ProducerStateTable(capacity=PIDS * 2, lifetime_ms=86_400_000)
        offer = table.offer_header
        for i in range(count):
            offer(headers[i], ts_list[i])
        return table

    def batched(count: int) -> ProducerStateTable:
        table = ProducerStateTable(capacity=PIDS * 2, lifetime_ms=86_400_000)
        for lo in range(0, count, BATCH):
            hi = min(lo + BATCH, count)
            table.offer_batch(arrow.slice(lo, hi - lo), ts[lo:hi])
        return table

    def naive(count: int) -> set[tuple[int, int]]:
        seen: set[tuple[int, int]] = set()
        for i in range(count):
            h = decode_pf(headers[i])
            key = (h.pid, h.seq)
            if key not in seen:
                seen.add(key)
        return seen

    progress.update(task, description="offer_header, record by record")
    table_seq, t_seq = _timed(lambda: per_record(n))
    progress.advance(task)
    progress.update(task, description="offer_batch")
    table_batch, t_batch = _timed(lambda: batched(n))
    progress.advance(task)
    progress.update(task, description="naive (pid, seq) set")
    seen, t_naive = _timed(lambda: naive(n))
    progress.advance(task)
    progress.update(task, description="state sizes")
    if table_seq != table_batch:
        raise RuntimeError("the batch path's state diverged from offer_header's")
    appended = sum(
        1
        for d in ProducerStateTable(PIDS * 2, 86_400_000).offer_batch(arrow, ts).verdicts()
        if d is Verdict.APPENDED
    )
    table_half_mem = _state_bytes(lambda: batched(half))
    table_full_mem = _state_bytes(lambda: batched(n))
    naive_half_mem = _state_bytes(lambda: naive(half))
    naive_full_mem = _state_bytes(lambda: naive(n))
    snap_half = len(batched(half).snapshot())
    snap_full = len(table_batch.snapshot())
    naive_snap_half = len(msgpack.packb(sorted(naive(half))))
    naive_snap_full = len(msgpack.packb(sorted(seen)))
    progress.advance(task)
    live = len(table_batch)
    rows = [
        {
            "contender": "offer_header (per record)",
            "records": n,
            "records/s": n / t_seq,
            "state bytes @n/2": table_half_mem,
            "state bytes @n": table_full_mem,
            "snapshot bytes/pid @n/2": snap_half / live,
            "snapshot bytes/pid @n": snap_full / live,
        },
        {
            "contender": f"offer_batch ({BATCH:,}/batch)",
            "records": n,
            "records/s": n / t_batch,
            "state bytes @n/2": table_half_mem,
            "state bytes @n": table_full_mem,
            "snapshot bytes/pid @n/2": snap_half / live,
            "snapshot bytes/pid @n": snap_full / live,
        },
        {
            "contender": "naive set of (pid, seq)",
            "records": n,
            "records/s": n / t_naive,
            "state bytes @n/2": naive_half_mem,
            "state bytes @n": naive_full_mem,
            "snapshot bytes/pid @n/2": naive_snap_half / live,
            "snapshot bytes/pid @n": naive_snap_full / live,
        },
    ]
    return BenchReport(
        title=f"broker rules: {n:,} in-order records, {PIDS:,} producers, {DUP_RATE:.0%} resends",
        rows=rows,
        params={
            "records": n,
            "pids": PIDS,
            "dup_rate": DUP_RATE,
            "batch": BATCH,
            "appended": appended,
            "live_pids": live,
        },
        notes=[
            f"appended {appended:,} of {n:,}; batch path = offer, checked in the same run",
            f"batch path vs per-record: {t_seq / t_batch:.1f}x; vs naive set: "
            f"{t_naive / t_batch:.1f}x",
            "state bytes: tracemalloc of the structure after the stream (Python objects)",
        ],
    )
