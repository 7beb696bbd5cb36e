"""The Spark driver SIGKILLed mid-batch (a sink subprocess), then restarted from its checkpoint.

The same batch dies twice, before either Delta commit and then between the rejects table's commit
and the log table's, before the restart that completes it. The producer re-sends acknowledged
records, so the batch has rejects to commit.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from deltalake import DeltaTable

from pidfence.demo.procs import Worker, sink_argv
from pidfence.spark_sink import read_rejects
from pidfence.spark_sink.delta.history import BATCH_KEY
from pidfence.spark_sink.output import Output
from pidfence.testing import run_argv
from tests.chaos.conftest import ChaosKit

pytestmark = pytest.mark.timeout(300)


def test_sink_driver_sigkill_mid_batch_then_restart_is_exactly_once(
    kafka: Any, new_topic: Any, lease_server: Any, stop_all: Any, chaos: ChaosKit
) -> None:
    records = 3000
    topic = new_topic(partitions=2)
    role = chaos.role("p", kafka.bootstrap, lease_server.address, topic, records, resend_every=200)
    stop_all(role)
    assert role.spawn().wait(120) == 0, role.current.tail()

    argv = sink_argv(kafka.bootstrap, topic, chaos.tmp / "output", chaos.tmp / "checkpoint")
    # The sink under the fault harness: its hook SIGKILLs the process group the sink leads, at
    # each point in turn (the same batch each time, its earlier attempt's files left behind).
    for point in ("before_manifest", "rejects_committed"):
        crashed = Worker(f"sink-crash-{point}", run_argv(argv, crash_at=point), chaos.logs)
        stop_all(crashed)
        code = crashed.start().wait(240)
        # The driver killed itself with SIGKILL before either Delta commit, or between the rejects
        # table's and the log table's.
        assert code == -9, crashed.tail()

    restarted = Worker("sink", argv, chaos.logs)
    stop_all(restarted)
    assert restarted.start().wait(240) == 0, restarted.tail()

    outcome = chaos.outcome()
    outcome.assert_clean()
    assert outcome.log.num_rows == records
    # The crash after the rejects' commit left it in place: the restart did not commit it again.
    output = Output.reading(str(chaos.tmp / "output"))
    for kind in ("log", "rejects"):
        history = DeltaTable(output.table(kind).uri).history()
        commits = Counter(int(c[BATCH_KEY]) for c in history if BATCH_KEY in c)
        assert commits and set(commits.values()) == {1}, (kind, commits)
    assert read_rejects(str(chaos.tmp / "output")).num_rows > 0
