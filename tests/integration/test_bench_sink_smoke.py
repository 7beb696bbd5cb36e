"""`pidfence bench sink` on tiny sizes: every contender runs and the figures are written.

The bench runs as ``pidfence bench sink --quick --bench-dir COPY`` in a subprocess, like a real
run: it starts its own Kafka and its own Spark JVM (an in-process run would stop the test
session's SparkSession when it finishes). Asserts only that it completes and what it wrote (rows
out, state, ratios present), never how fast: it skips the warm-up queries, which only make the
timings fair (each contender still runs once, measured, on the whole topic).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.bench import run_quick_bench

RECORDS = 20_000

pytestmark = pytest.mark.timeout(900)


def test_sink_bench_runs_every_contender_on_tiny_sizes(tmp_path: Path) -> None:
    # No warm-up queries: they only make timings fair, and this test asserts no timing.
    written = run_quick_bench("sink", tmp_path, RECORDS, timeout=840, PIDFENCE_BENCH_WARMUP="0")
    rows = {row["contender"][:3]: row for row in written["rows"]}
    assert {"(a)", "(n)", "(b)", "(c)", "(v)"} <= set(rows)
    assert all(row["records"] == RECORDS for row in rows.values())
    # Every record reaches the plain sinks; the deduplicating ones keep exactly the fresh ones.
    sent = written["params"]["sent"]
    assert rows["(a)"]["rows out"] == RECORDS
    assert rows["(n)"]["rows out"] == RECORDS
    for dedup in ("(b)", "(c)", "(v)"):
        assert rows[dedup]["rows out"] == sent["fresh"], dedup
    # Verification refused nothing: every producer's first record carries its certificate.
    assert written["params"]["verify"]["forged_reasons"] == {}
    assert sent["certified"] >= 1
    assert rows["(c)"]["state bytes @end"] > 0
    assert rows["(b)"]["state bytes @end"] > 0
    ratios = written["params"]["ratios"]
    assert {"pidfence_vs_plain", "verify_on_vs_off", "pidfence_share_of_noop_writer"} <= set(ratios)
    assert any(note.startswith("load average") for note in written["notes"])
    # The bench's own check of every measured run's output passed (it fails the run otherwise).
    assert written["failed"] is None
    assert (
        "output rows: every measured run wrote every record, or the fresh ones" in written["notes"]
    )
