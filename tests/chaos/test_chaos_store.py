"""The object store under the sink fails mid-commit: SeaweedFS SIGKILLed and restarted on its data,
paused and resumed, its requests slowed, reset and left unanswered through a fault proxy.

Each test holds the sink at a point of its commit (``python -m pidfence.testing.run --hold-at``),
breaks the store, lets the sink go on, and starts the sink again whenever it exits 75, as a
supervisor would; the runs after it commit the next batch. Then ``pidfence verify``
on the ``s3://`` output finds no anomaly (every event once, in order), and every batch is in one
Delta commit per table that adds exactly the files its manifest names: nothing committed twice, no
half-written batch visible to delta-rs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pidfence.cli.exits import EXIT_OK
from pidfence.demo.procs import Worker, pidfence_argv
from pidfence.services.process import ServiceFailed, wait_until
from pidfence.services.seaweedfs import SeaweedFS
from pidfence.spark_sink.delta.history import BATCH_KEY
from pidfence.spark_sink.output import Output
from pidfence.testing import Supervisor, Toxiproxy, run_argv
from pidfence.testing.sink_faults import HELD, RELEASE
from pidfence.testing.toxiproxy import Proxy
from tests.fixtures.commands import run_pidfence
from tests.integration.test_delta_shared import Upstream

# A hang guard, not a speed claim: one test takes about 300 s at load 14 on 2 cores.
pytestmark = pytest.mark.timeout(900)

#: Events per producer in each round (two producers, one per partition).
EVENTS = 60


@dataclass
class StoreRun:
    """One test's pipeline: a topic, an output and checkpoint in a fresh bucket, the sink's runs.

    ``env`` is the AWS environment the sink sees (the proxy's endpoint under network faults);
    the checks read the store directly with ``store_env``.
    """

    tmp: Path
    bootstrap: str
    topic: str
    bucket: str
    env: dict[str, str]
    store_env: dict[str, str]
    up: Upstream
    exits: list[tuple[str, int]] = field(default_factory=list)
    rounds: int = 0
    #: Sinks started held at a point, with their folders: released and stopped at teardown.
    held: list[tuple[Worker, Path]] = field(default_factory=list)

    @property
    def out(self) -> str:
        """The output, as a user names it."""
        return f"s3://{self.bucket}/lake/out"

    def argv(self) -> list[str]:
        """``pidfence sink --available-now`` over the topic, checkpoint on the store too."""
        where = ["--output", self.out, "--checkpoint", f"s3a://{self.bucket}/lake/ckpt"]
        return pidfence_argv(
            "sink",
            *("--bootstrap", self.bootstrap, "--topic", self.topic, *where),
            *("--available-now", "--starting-offsets", "earliest", "--master", "local[2]"),
        )

    def send_round(self) -> None:
        """``EVENTS`` new events per producer, then ten replays (duplicates)."""
        first = self.rounds * EVENTS
        self.up.send(301, range(first, first + EVENTS), 0)
        self.up.send(302, range(first, first + EVENTS), 1)
        self.up.send(301, range(first + 10, first + 20), 0)
        self.rounds += 1

    def held_at(self, point: str) -> tuple[Worker, Path]:
        """A sink started under the fault harness, once it waits at ``point``; and the folder
        where :func:`release` lets it go on."""
        folder = self.tmp / f"hold-{point}-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        argv = run_argv(self.argv(), hold_at=(point, folder))
        sink = Worker("sink-held", argv, self.tmp / "logs", env=self.env).start()
        self.held.append((sink, folder))
        wait_until(
            lambda: (folder / HELD).exists() or not sink.running, 240, f"the sink at {point}"
        )
        assert sink.running, sink.tail()
        return sink, folder

    def supervise(self, first: Worker, before_restart: Callable[[], None] = lambda: None) -> None:
        """Wait for ``first`` and every restart after an exit 75 (``before_restart`` first)
        until one exits 0; any other exit fails the test with the sink's log."""
        sinks = [first]

        def restart() -> None:
            before_restart()
            name = f"sink-{len(sinks)}"
            sinks.append(Worker(name, self.argv(), self.tmp / "logs", env=self.env).start())

        supervisor = Supervisor("sink", lambda: sinks[-1], restart, max_restarts=4, backoff_s=0.2)
        deadline = time.monotonic() + 420
        try:
            while not supervisor.done:
                supervisor.poll()
                assert time.monotonic() < deadline, sinks[-1].tail()
                time.sleep(0.2)
        except ServiceFailed as exc:
            raise AssertionError(f"{exc}\n{sinks[-1].tail(60)}") from exc
        finally:
            for sink in sinks:
                sink.stop()
            self.exits += supervisor.exits

    def clean_pass(self) -> None:
        """One more round of events and a pass with nothing broken (the next batch)."""
        self.send_round()
        self.supervise(Worker("sink-clean", self.argv(), self.tmp / "logs", env=self.env).start())

    def assert_exactly_once(self) -> None:
        """Verify's verdict, then each batch in one commit per table with its manifest's files."""
        ledger = str(self.tmp / "ledger.jsonl")
        # The store named by --storage-option, over an environment that names a dead endpoint.
        endpoint = f"AWS_ENDPOINT_URL={self.store_env['AWS_ENDPOINT_URL']}"
        verify = run_pidfence(
            *("verify", "--ledger", ledger, "--output", self.out, "--json"),
            *("--storage-option", endpoint),
            timeout=300,
            env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
        )
        assert verify.returncode == EXIT_OK, verify.stdout + verify.stderr
        report = json.loads(verify.stdout)
        assert report["ok"], report
        output = Output.reading(self.out)
        manifests = list(output.manifests())
        assert [m.batch for m in manifests] == list(range(self.rounds)), self.exits
        for kind in ("log", "rejects"):
            table = DeltaTable(output.table(kind).uri)
            commits = Counter(int(c[BATCH_KEY]) for c in table.history() if BATCH_KEY in c)
            assert set(commits.values()) == {1}, (kind, commits)  # nothing committed twice
            named = {rel for m in manifests for p in m.parts if (rel := p.files.of(kind))}
            added = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
            assert set(added) == named, kind  # no file of another attempt
        rows = DeltaTable(self.out).to_pyarrow_table()
        assert rows.num_rows == 2 * EVENTS * self.rounds


@pytest.fixture
def store_run(
    kafka: Any,
    new_topic: Any,
    own_s3_store: SeaweedFS,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[StoreRun]:
    """A pipeline on a store of the test's own; round one of the events is in the topic. The
    sinks run in the test's folder (their logs' folder must not land in the checkout)."""
    monkeypatch.chdir(tmp_path)
    env = own_s3_store.environment()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bucket = f"chaos-{uuid.uuid4().hex[:8]}"
    own_s3_store.make_bucket(bucket)
    topic = new_topic(partitions=2)
    up = Upstream(kafka.bootstrap, topic, tmp_path / "ledger.jsonl")
    run = StoreRun(tmp_path, kafka.bootstrap, topic, bucket, env, env, up)
    run.send_round()
    yield run
    for sink, folder in run.held:  # a test that failed while a sink waited at its point
        release(folder)
        sink.stop()


@pytest.fixture
def s3_proxy(toxiproxy: Toxiproxy, own_s3_store: SeaweedFS, store_run: StoreRun) -> Iterator[Proxy]:
    """A fault proxy in front of the store's S3 port; the sink reaches the store through it."""
    proxy = toxiproxy.create_proxy(f"s3-{uuid.uuid4().hex[:8]}", f"127.0.0.1:{own_s3_store.port}")
    store_run.env = {**store_run.env, "AWS_ENDPOINT_URL": f"http://{proxy.address}"}
    yield proxy
    proxy.delete()


def release(folder: Path) -> None:
    """Let a held sink go on."""
    (folder / RELEASE).touch()


def test_store_sigkilled_between_the_two_delta_commits_then_restarted_on_its_data(
    store_run: StoreRun, own_s3_store: SeaweedFS
) -> None:
    sink, folder = store_run.held_at("rejects_committed")
    own_s3_store.kill(0)
    release(folder)  # the log table's commit meets a dead store
    wait_until(lambda: not sink.running, 120, "the sink to give up on the dead store")

    def store_back() -> None:
        if not own_s3_store[0].running:
            own_s3_store.restart(0)

    store_back()
    store_run.supervise(sink, store_back)
    assert store_run.exits[0] == ("sink-held", 75), store_run.exits
    store_run.clean_pass()
    store_run.assert_exactly_once()


def test_store_paused_mid_commit_then_resumed(store_run: StoreRun, own_s3_store: SeaweedFS) -> None:
    sink, folder = store_run.held_at("before_manifest")
    own_s3_store.pause(0)
    release(folder)  # the manifest's conditional put meets a store that does not answer
    time.sleep(8)
    own_s3_store.resume(0)
    store_run.supervise(sink)
    store_run.assert_exactly_once()


def test_slow_store_whose_connections_reset_then_whose_answers_are_lost_mid_commit(
    store_run: StoreRun, s3_proxy: Proxy
) -> None:
    s3_proxy.add_toxic("slow", "latency", latency=40, jitter=20)  # every request, throughout
    sink, folder = store_run.held_at("rejects_committed")
    s3_proxy.add_toxic("reset", "reset_peer", "upstream", timeout=0)
    release(folder)  # the log table's commit: every connection reset
    time.sleep(5)
    s3_proxy.remove_toxic("reset")
    store_run.supervise(sink)

    # Requests reach the store, which carries them out; the answers are dropped and the
    # connections closed after 2 s: the sink cannot know whether its manifest's put happened.
    store_run.send_round()
    sink, folder = store_run.held_at("before_manifest")
    s3_proxy.add_toxic("lost", "timeout", "downstream", timeout=2000)
    release(folder)
    time.sleep(6)
    s3_proxy.remove_toxic("lost")
    store_run.supervise(sink)
    s3_proxy.remove_toxic("slow")
    store_run.assert_exactly_once()
