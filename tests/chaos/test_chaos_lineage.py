"""Issue 10's two scenarios on real processes: a zombie that wakes past its rollover or expiry.

Real ZooKeeper, Kafka and lease server (short leases), ``pidfence produce`` processes, the Spark
sink, and the event-level checker. A writes z0..z9, checkpoints and is SIGSTOPped; B resumes a
copy of A's checkpoint and writes z10..z19; A is woken past its rollover point (scenario 1) or
past its lease end, after B resumed an expired checkpoint (scenario 2). Before DESIGN §9, A rolled
to a fresh pid and appended z10..z19 a second time. Now its roll fails (``ProducerFenced``), and
every z-value is in the output log exactly once.

The faults are placed deterministically: A stops itself right after its second state save (the
``--stop-after-checkpoint`` fault hook), and the test waits for the clock to pass A's rollover
point or lease end (read from A's checkpoint) before it sends SIGCONT. A third test stops A with
SIGSTOP from outside at whatever point it has reached, which must not matter.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pidfence.demo.procs import pidfence_argv
from pidfence.services.process import track
from tests.chaos.conftest import ChaosKit

pytestmark = pytest.mark.timeout(420)

#: Short leases: the rollover point (half the lifetime, --lifetime-rollover 0.5) and the lease
#: end are reached within a test.
LIFETIME_MS = 16_000
EVENTS = 20


class Producer:
    """One ``pidfence produce`` process writing z0..z{count-1} under the name ``z``."""

    def __init__(
        self, kit: ChaosKit, label: str, env: dict[str, str], argv: list[str], state: Path
    ) -> None:
        self.label = label
        self.state = state
        self.log = kit.logs / f"{label}.log"
        with self.log.open("wb") as out:
            self.proc = track(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env))

    def state_data(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.state.read_text())
        return data

    def stopped(self) -> bool:
        """True while the process is stopped (state ``T`` in /proc)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def wait_stopped(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.stopped():
            assert self.proc.poll() is None, self.tail()
            assert time.monotonic() < deadline, f"{self.label} never stopped: {self.tail()}"
            time.sleep(0.05)

    def wait(self, timeout: float = 180.0) -> int:
        return self.proc.wait(timeout)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(30)


def produce(
    kit: ChaosKit,
    label: str,
    topic: str,
    bootstrap: str,
    lease: str,
    state: Path,
    *extra: str,
) -> Producer:
    argv = pidfence_argv(
        "produce",
        "--bootstrap",
        bootstrap,
        "--lease-server",
        lease,
        "--topic",
        topic,
        "--count",
        str(EVENTS),
        "--keys",
        "0",
        "--name",
        "z",
        "--checkpoint-every",
        "10",
        "--lifetime-rollover",
        "0.5",
        "--state",
        str(state),
        "--ledger",
        str(kit.ledgers / f"{label}.jsonl"),
        *extra,
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return Producer(kit, label, env, argv, state)


@dataclass
class Relay:
    """Producers A and B writing z0..z19 to one topic through one short-lease server."""

    kit: ChaosKit
    bootstrap: str
    topic: str
    lease: str
    started: list[Producer] = field(default_factory=list)

    def start(self, label: str, *extra: str) -> Producer:
        """Producer ``label`` with the state file ``<tmp>/<label>.json``, stopped at teardown."""
        producer = produce(
            self.kit, label, self.topic, self.bootstrap, self.lease, self.state(label), *extra
        )
        self.started.append(producer)
        return producer

    def state(self, label: str) -> Path:
        """Producer ``label``'s state file."""
        return self.kit.tmp / f"{label}.json"

    def heir_of(self, a: Producer, *extra: str) -> Producer:
        """B, resuming a copy of the checkpoint A stored, run to its end; ``extra`` repeats the
        options of A that shape its records (a resume is refused without them)."""
        shutil.copy(a.state, self.state("b"))
        b = self.start("b", *extra)
        assert b.wait() == 0, b.tail()
        return b


@pytest.fixture
def relay(
    chaos: ChaosKit, kafka: Any, new_topic: Any, lease_server_factory: Any
) -> Iterator[Relay]:
    """A :class:`Relay` on a new two-partition topic; every producer it started is stopped."""
    lease = lease_server_factory(lifetime_ms=LIFETIME_MS).address
    relay = Relay(chaos, kafka.bootstrap, new_topic(partitions=2), lease)
    yield relay
    for producer in relay.started:
        producer.stop()


def wait_clock_past(epoch_ms: int) -> None:
    """Wait until the wall clock passes ``epoch_ms`` (the lease server's time base)."""
    while time.time() * 1000 <= epoch_ms:
        time.sleep(0.1)


def z_values(relay: Relay, spark: Any) -> tuple[Counter[int], Any]:
    """Run the sink over the topic; the output log's record indexes and the checker's outcome."""
    relay.kit.sink(spark, relay.bootstrap, relay.topic)
    outcome = relay.kit.outcome()
    indexes = Counter(json.loads(v)["i"] for v in outcome.log.column("value").to_pylist())
    return indexes, outcome


def assert_every_event_once(relay: Relay, spark: Any) -> Any:
    indexes, outcome = z_values(relay, spark)
    assert indexes == Counter(range(EVENTS)), (sorted(indexes.items()), outcome.verdicts)
    counts = outcome.anomalies()
    assert counts["event_duplicate"] == 0 and counts["event_lost"] == 0, counts
    outcome.assert_clean()
    return outcome


@pytest.mark.parametrize("scenario", ["past_rollover", "past_expiry"])
def test_zombie_woken_after_its_checkpoint_was_resumed_appends_nothing_twice(
    relay: Relay, spark: Any, scenario: str
) -> None:
    # Save 1 is right after the producer opens, save 2 after z0..z9: A stops itself there.
    a = relay.start("a", "--stop-after-checkpoint", "2")
    a.wait_stopped()
    checkpoint = a.state_data()["checkpoint"]
    assert a.state_data()["next_i"] == 10
    if scenario == "past_expiry":
        wait_clock_past(checkpoint["expire_ms"])  # A's lease ends before B resumes
    b = relay.heir_of(a)
    assert "resumed=True" in b.tail()
    # Past A's rollover point (and, in scenario 2, its lease end): A's next step is a roll.
    margin = checkpoint["lifetime_ms"] // 2
    wait_clock_past(checkpoint["expire_ms"] - margin)
    os.kill(a.proc.pid, signal.SIGCONT)
    assert a.wait() == 3, a.tail()  # fenced: a non-retriable failure
    assert "ProducerFenced" in a.tail(), a.tail()

    b_pid = b.state_data()["checkpoint"]["pid"]
    if scenario == "past_expiry":
        assert b_pid != checkpoint["pid"], "B should have rolled the expired pid into a successor"
    else:
        assert b_pid == checkpoint["pid"]
    outcome = assert_every_event_once(relay, spark)
    if scenario == "past_rollover":
        assert outcome.verdicts["FENCE"] >= 2  # B fenced both partitions


def test_zombie_stopped_at_any_point_and_woken_past_its_rollover(relay: Relay, spark: Any) -> None:
    """A is stopped from outside wherever it is (records in flight or acknowledged past its
    checkpoint); B resumes A's last stored checkpoint; the outcome must not depend on where."""
    rate = ("--rate", "10")
    a = relay.start("a", *rate, "--checkpoint-every", "3")
    deadline = time.monotonic() + 120
    while not (a.state.exists() and a.state_data()["next_i"] >= 6):
        assert a.proc.poll() is None, a.tail()
        assert time.monotonic() < deadline, a.tail()
        time.sleep(0.05)
    os.kill(a.proc.pid, signal.SIGSTOP)
    a.wait_stopped()
    # At 10 records/s, 14 records were still to go when A stopped: it must roll when woken.
    assert a.state_data()["next_i"] < EVENTS - 5
    checkpoint = a.state_data()["checkpoint"]
    relay.heir_of(a, *rate)
    wait_clock_past(checkpoint["expire_ms"] - checkpoint["lifetime_ms"] // 2)
    os.kill(a.proc.pid, signal.SIGCONT)
    assert a.wait() == 3, a.tail()  # fenced: a non-retriable failure
    assert "ProducerFenced" in a.tail(), a.tail()
    assert_every_event_once(relay, spark)
