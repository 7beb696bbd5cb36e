"""`pidfence bench copier` on tiny sizes: every row is measured and written (never how fast).

It runs as ``pidfence bench copier --quick --bench-dir COPY`` in a subprocess, like a real run (its
own ZooKeeper, Kafka and lease server, members as processes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.bench import run_quick_bench

SESSION_S = 10  # bench/copier.py passes --session-timeout 10
HEARTBEAT_S = 3  # librdkafka heartbeat.interval.ms default

# Over a minute: handed out first under xdist (tests/README.md).
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_copy_bench_measures_one_to_three_members_and_both_takeovers(tmp_path: Path) -> None:
    written = run_quick_bench("copier", tmp_path, 500, timeout=540)
    rows = {row["contender"]: row for row in written["rows"]}
    members = ["1 member", "2 members", "3 members"]
    assert all(rows[name]["records"] == 3000 and rows[name]["msgs_per_s"] > 0 for name in members)
    for name in ("takeover after SIGKILL", "takeover after SIGTERM (leave)"):
        waits = rows[name]["per_partition_s"]
        assert len(waits) == 6 and rows[name]["takeover_s"] == max(waits.values()) > 0
    # A killed member's partitions wait for its session to time out: the coordinator counts the
    # session from the member's last heartbeat (librdkafka's heartbeat.interval.ms, 3 s by
    # default), which can come up to one interval before the kill.
    assert rows["takeover after SIGKILL"]["takeover_s"] >= SESSION_S - HEARTBEAT_S
