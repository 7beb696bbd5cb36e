"""Producer faults on real processes: SIGKILL + resume, and a zombie across a generation bump."""

from __future__ import annotations

from typing import Any

import pytest

from pidfence.demo.faults import KillAndResume, Zombie, drive
from tests.chaos.conftest import ChaosKit

pytestmark = pytest.mark.timeout(240)

RECORDS = 2000
RATE = 400.0


def test_producer_sigkill_resumes_with_fence_and_no_anomaly(
    chaos: ChaosKit, kafka: Any, new_topic: Any, lease_server: Any, spark: Any
) -> None:
    topic = new_topic(partitions=2)
    role = chaos.start("p", kafka.bootstrap, lease_server.address, topic, RECORDS, rate=RATE)
    fault = KillAndResume(role, at=RECORDS // 3)
    drive([fault], timeout=150, until=lambda: not role.running())

    assert role.current.exit_code() == 0, role.current.tail()
    assert len(role.instances) == 2, fault.events
    assert role.instances[1].fences() >= 1, "the restarted instance wrote no FENCE"
    outcome = chaos.clean_outcome(spark, kafka.bootstrap, topic)
    assert outcome.verdicts["FENCE"] >= 1
    # Every record index was appended exactly once despite the crash.
    assert outcome.log.num_rows == RECORDS


def test_zombie_is_fenced_after_its_replacement_bumps(
    chaos: ChaosKit, kafka: Any, new_topic: Any, lease_server: Any, spark: Any
) -> None:
    topic = new_topic(partitions=2)
    role = chaos.start("z", kafka.bootstrap, lease_server.address, topic, RECORDS, rate=RATE)
    fault = Zombie(role, at=RECORDS // 3, zombie_records=20, zombie_s=10)
    drive([fault], timeout=150, until=lambda: not role.running())

    assert fault.zombie is not None and fault.replacement is not None
    assert fault.replacement.exit_code() == 0, fault.replacement.tail()
    outcome = chaos.clean_outcome(spark, kafka.bootstrap, topic)
    # The zombie really wrote after the bump, and the sink refused it.
    assert outcome.verdicts["FENCED"] >= 1, (fault.events, outcome.verdicts)
    assert outcome.verdicts["FENCE"] >= 1
