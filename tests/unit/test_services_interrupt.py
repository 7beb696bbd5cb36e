"""``services up`` stopped part-way (a failure, Ctrl-C, SIGTERM) stops every server it started;
and ``topic create``, the quickstart's next step, makes a LogAppendTime topic.

The clusters' ``start`` and ``stop`` are replaced by fakes that only record what they were asked,
and ``create_topic`` by one that records its arguments: no server is started or asked anything,
no process but this one is signalled.
"""

from __future__ import annotations

import inspect
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.services import stack
from pidfence.services.kafka import KafkaCluster
from pidfence.services.node import Cluster
from pidfence.services.seaweedfs import SeaweedFS
from pidfence.services.zookeeper import ZooKeeperEnsemble

CLASSES: dict[str, type[Cluster]] = {
    "zookeeper": ZooKeeperEnsemble,
    "kafka": KafkaCluster,
    "seaweedfs": SeaweedFS,
}


class Calls:
    """What the fake clusters were asked, in order: ``("start", "kafka")``, ``("stop", ...)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        #: kind -> what its start does after it is recorded (e.g. raise an interrupt).
        self.then: dict[str, Callable[[], None]] = {}
        #: kind -> what its stop does after it is recorded.
        self.on_stop: dict[str, Callable[[], None]] = {}

    def started(self) -> list[str]:
        return [kind for what, kind in self.events if what == "start"]

    def stopped(self) -> list[str]:
        return [kind for what, kind in self.events if what == "stop"]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    found = Calls()
    for kind, cls in CLASSES.items():

        def start(self: Cluster, timeout: float = 0.0, kind: str = kind) -> Cluster:
            del timeout
            found.events.append(("start", kind))
            found.then.get(kind, lambda: None)()
            return self

        def stop(self: Cluster, kind: str = kind) -> None:
            del self
            found.events.append(("stop", kind))
            found.on_stop.get(kind, lambda: None)()

        monkeypatch.setattr(cls, "start", start)
        monkeypatch.setattr(cls, "stop", stop)
    return found


def _raise(exc: BaseException) -> Callable[[], None]:
    def go() -> None:
        raise exc

    return go


def test_an_interrupt_in_the_third_start_stops_the_first_two_and_the_third(
    calls: Calls, tmp_path: Path
) -> None:
    """Ctrl-C while the S3 store starts: the store (whose process may already run) is stopped
    too, not only Kafka and ZooKeeper."""
    calls.then["seaweedfs"] = _raise(KeyboardInterrupt())
    services = stack.Services(run_dir=tmp_path, s3=True)
    with pytest.raises(KeyboardInterrupt):
        services.up(timeout=1)
    assert calls.started() == ["zookeeper", "kafka", "seaweedfs"]
    assert calls.stopped() == ["seaweedfs", "kafka", "zookeeper"]
    assert stack.read_state(tmp_path) is None


def test_an_interrupt_while_zookeeper_gets_ready_stops_zookeeper(
    calls: Calls, tmp_path: Path
) -> None:
    """Ctrl-C during ZooKeeper's readiness wait: its node runs in a session of its own, so
    nothing but ``up`` can stop it."""
    calls.then["zookeeper"] = _raise(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        stack.Services(run_dir=tmp_path).up(timeout=1)
    assert calls.started() == ["zookeeper"]
    assert "zookeeper" in calls.stopped()


def test_a_stop_that_fails_does_not_leave_the_others_running(calls: Calls, tmp_path: Path) -> None:
    """One stop raising (a node that would not die) must not skip the servers after it."""
    calls.then["seaweedfs"] = _raise(KeyboardInterrupt())
    calls.on_stop["kafka"] = _raise(OSError("kafka-0 would not stop"))
    with pytest.raises(KeyboardInterrupt):
        stack.Services(run_dir=tmp_path, s3=True).up(timeout=1)
    assert calls.stopped() == ["seaweedfs", "kafka", "zookeeper"]


def test_a_second_ctrl_c_is_ignored_while_the_servers_are_stopped(
    calls: Calls, tmp_path: Path
) -> None:
    """While a failed ``up`` stops what it started, SIGINT and SIGTERM are ignored (a second
    Ctrl-C there would leave the rest running); the handlers come back after."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    seen: dict[str, object] = {}

    def look() -> None:
        seen["int"] = signal.getsignal(signal.SIGINT)
        seen["term"] = signal.getsignal(signal.SIGTERM)

    calls.then["kafka"] = _raise(KeyboardInterrupt())
    calls.on_stop["zookeeper"] = look
    with pytest.raises(KeyboardInterrupt):
        stack.Services(run_dir=tmp_path).up(timeout=1)
    assert seen == {"int": signal.SIG_IGN, "term": signal.SIG_IGN}
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_cli_ctrl_c_stops_what_up_started_and_exits_130(calls: Calls, tmp_path: Path) -> None:
    """Ctrl-C while Kafka gets ready: both servers stopped, one line, exit 130."""
    calls.then["kafka"] = _raise(KeyboardInterrupt())
    result = CliRunner().invoke(app, ["services", "up", "--run-dir", str(tmp_path)])
    assert calls.stopped() == ["kafka", "zookeeper"]
    assert result.exit_code == 130, result.output
    assert result.stderr.strip() == (
        "pidfence services up: interrupted (SIGINT): every server it started was stopped"
    )


class _NotHandled(BaseException):
    """The test's own SIGTERM handler raised this: ``up`` did not handle SIGTERM itself."""


@pytest.fixture
def own_handlers() -> Iterator[Callable[[int, FrameType | None], None]]:
    """A handler of the test's own on SIGTERM and SIGHUP (never the default: it would end the
    test run when ``up`` does not handle the signal), restored after."""

    def handler(signum: int, frame: FrameType | None) -> None:
        del frame
        raise _NotHandled(signum)

    signals = (signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield handler
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _signal_self(sig: int) -> Callable[[], None]:
    def go() -> None:
        os.kill(os.getpid(), sig)
        for _ in range(100):  # the handler runs in this thread, between two of these sleeps
            time.sleep(0.05)

    return go


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_cli_sigterm_stops_up_like_ctrl_c(
    calls: Calls,
    own_handlers: Callable[[int, FrameType | None], None],
    tmp_path: Path,
    sig: int,
    code: int,
) -> None:
    """``timeout 60 pidfence services up`` (SIGTERM) or a closed terminal (SIGHUP) while Kafka
    starts: every server started is stopped, exit 128 + the signal, and the handler that was
    there before ``up`` is back after it."""
    calls.then["kafka"] = _signal_self(sig)
    result = CliRunner().invoke(app, ["services", "up", "--run-dir", str(tmp_path)])
    assert not isinstance(result.exception, _NotHandled), "up left the signal to the default"
    assert calls.stopped() == ["kafka", "zookeeper"]
    assert result.exit_code == code, result.output
    name = signal.Signals(sig).name
    assert result.stderr.strip() == (
        f"pidfence services up: stopped by {name}: every server it started was stopped"
    )
    assert signal.getsignal(sig) is own_handlers


# ---- `pidfence topic create`: the raw topic the README's quickstart makes -------------------
# (here for want of a unit-test module of pidfence.cli.topic)


@pytest.fixture
def created(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """The arguments every ``create_topic`` call got (no Kafka is asked anything)."""
    import pidfence.services

    calls: list[dict[str, object]] = []
    signature = inspect.signature(pidfence.services.create_topic)

    def create_topic(*args: Any, **kwargs: Any) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        calls.append({key: given.get(key) for key in ("name", "partitions", "config")})
        return str(given["name"])

    monkeypatch.setattr(pidfence.services, "create_topic", create_topic)
    return calls


def test_topic_create_makes_a_log_append_time_topic_by_default(
    created: list[dict[str, object]],
) -> None:
    """The sink warns about CreateTime topics and says pidfence's own use LogAppendTime: the
    topic ``topic create`` makes (the README's ``orders``) must be one of them."""
    argv = ["topic", "create", "orders", "--partitions", "2", "--bootstrap", "127.0.0.1:1"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert created == [
        {
            "name": "orders",
            "partitions": 2,
            "config": {"message.timestamp.type": "LogAppendTime"},
        }
    ]
    from pidfence.demo.topic import RAW_TOPIC_CONFIG

    assert created[0]["config"] == RAW_TOPIC_CONFIG  # as the demo's raw topics


def test_topic_create_keeps_create_time_when_asked(created: list[dict[str, object]]) -> None:
    """``--timestamp-type CreateTime`` (a copier's input topic keeps its writers' times)."""
    argv = ["topic", "create", "up", "--bootstrap", "127.0.0.1:1"]
    result = CliRunner().invoke(app, [*argv, "--timestamp-type", "CreateTime"])
    assert result.exit_code == 0, result.output
    assert created[0]["config"] == {"message.timestamp.type": "CreateTime"}
    result = CliRunner().invoke(app, [*argv, "--timestamp-type", "WallClock"])
    assert result.exit_code == 2


def test_a_signal_ignored_before_up_stays_ignored() -> None:
    """``nohup pidfence services up``: SIGHUP is ignored on purpose, and closing the terminal
    must not stop the start (it raised and stopped every server, exit 129)."""
    from pidfence.lifecycle import signals_raise

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with signals_raise((signal.SIGTERM, signal.SIGHUP), stack.ServicesError):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)  # a handler would have raised by now
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
