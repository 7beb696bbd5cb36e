"""The Spark driver SIGKILLed mid-batch (a sink subprocess), then restarted from its checkpoint.

The same batch dies twice, before either Delta commit and then between the rejects table's commit
and the log table's, before the restart that completes it.
"""

from __future__ import annotations

from typing import Any

import pytest

from pidfence.demo.procs import Worker, sink_argv
from pidfence.testing import run_argv
from tests.chaos.conftest import ChaosKit

pytestmark = pytest.mark.timeout(300)


def test_sink_driver_sigkill_mid_batch_then_restart_is_exactly_once(
    kafka: Any, new_topic: Any, lease_server: Any, stop_all: Any, chaos: ChaosKit
) -> None:
    records = 3000
    topic = new_topic(partitions=2)
    role = chaos.role("p", kafka.bootstrap, lease_server.address, topic, records)
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
