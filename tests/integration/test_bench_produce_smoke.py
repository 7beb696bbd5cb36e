"""`pidfence bench produce` on tiny sizes: every contender runs and the figures are written.

The bench runs as ``pidfence bench produce --quick --bench-dir COPY`` in a subprocess, like a
real run (its own ZooKeeper, Kafka and lease servers). Asserts only that it completes and what it
wrote (every row, the header bytes read back, pfc on the signed producers' first records, pfm on
every record of the per-record mode's), never how fast.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.bench import run_quick_bench

RECORDS = 2_000

# Over a minute: handed out first under xdist (tests/README.md).
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_produce_bench_runs_every_contender_on_tiny_sizes(tmp_path: Path) -> None:
    written = run_quick_bench("produce", tmp_path, RECORDS, timeout=540)
    rows = {row["contender"]: row for row in written["rows"]}
    assert len(rows) == 12 and all(row["records"] == RECORDS for row in rows.values())
    plain = rows["plain confluent-kafka (no headers)"]
    assert plain["header_bytes_per_record"] == 0 and plain["pfc_records"] == 0
    # The constant header: varint(2) + "pf" + varint(12) + 12 bytes on every timed record.
    assert rows["confluent-kafka + idempotence + constant 12-byte header"][
        "header_bytes_per_record"
    ] == pytest.approx(16.0 * RECORDS / (RECORDS + 1))  # the prime record has none
    ours = [name for name in rows if name.startswith("IdempotentProducer")]
    assert len(ours) == 7
    for name in ours:
        assert rows[name]["header_bytes_per_record"] > 14, name
        assert rows[name]["cpu_vs_header_only"] > 0 and rows[name]["ratio_to_header_only"] > 0
    # Signing on: the first record of each of the 4 partitions carries pfc (more if the run
    # outlasts the 1 s re-stamp interval).
    signed = [name for name in ours if "signing" in name]
    assert len(signed) == 2 and all(rows[name]["pfc_records"] >= 4 for name in signed)
    assert all(rows[name]["pfc_records"] == 0 for name in ours if name not in signed)
    # Per-record mode: every record carries pfm (the prime record too); no other contender's.
    maced = "IdempotentProducer, signing + per-record MAC (pfc, pfm)"
    assert rows[maced]["pfm_records"] == RECORDS + 1
    assert all(rows[name]["pfm_records"] == 0 for name in rows if name != maced)
    assert "Per-record mode" in " ".join(written["notes"])
    assert "4 threads sharing one producer" in " ".join(written["notes"])
    assert any(note.startswith("load average") for note in written["notes"])
