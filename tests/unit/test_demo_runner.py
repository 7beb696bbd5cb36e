"""``run_demo``'s control flow with its phases replaced (no process is started): SIGTERM unwinds
through the cleanup, a signal during the cleanup does not cut it short, errors pidfence does not
name become one demo error, and the Spark session it starts is stopped once."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from pidfence.demo import DemoConfig
from pidfence.demo import runner as runner_module
from pidfence.demo.runner import DemoFailed, Stopped, StopSignals, run_demo


def _config(tmp_path: Path) -> DemoConfig:
    return DemoConfig(out=tmp_path / "out", faults=frozenset(), copier_records=0)


def _quiet() -> Console:
    return Console(quiet=True)


def _services(cleanups: list[Any], ran: list[str], on_start: Any = None) -> Any:
    def start_services(config: Any, paths: Any, given: list[Any], store: Any) -> Any:
        given.append(lambda: ran.append("first stop"))
        given.append(lambda: ran.append("second stop"))
        cleanups.extend(given)
        if on_start is not None:
            on_start()
        ends = SimpleNamespace(metrics={})
        return SimpleNamespace(endpoints=ends, links=None, notes=[])

    return start_services


def _no_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = SimpleNamespace(serve=lambda port: "http://metrics")
    monkeypatch.setattr(runner_module, "_sink_metrics", lambda ends, cleanups: metrics)


def test_sigterm_unwinds_through_the_cleanup_and_exits_143(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    before = signal.getsignal(signal.SIGTERM)

    def terminated() -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(runner_module, "start_services", _services([], ran, terminated))
    with pytest.raises(Stopped) as stopped:
        run_demo(_config(tmp_path), _quiet(), spark=object())
    assert stopped.value.exit_code == 143
    assert ran == ["second stop", "first stop"]
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(
    ("signum", "error"), [(signal.SIGTERM, Stopped), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_signal_during_the_cleanup_waits_until_every_process_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, error: type[BaseException]
) -> None:
    ran: list[str] = []
    cleanups: list[Any] = []

    def start_services(config: Any, paths: Any, given: list[Any], store: Any) -> Any:
        given.append(lambda: ran.append("first stop"))
        given.append(lambda: (os.kill(os.getpid(), signum), ran.append("signalled")))
        cleanups.extend(given)
        raise TimeoutError("a service did not come up")

    monkeypatch.setattr(runner_module, "start_services", start_services)
    with pytest.raises(error):
        run_demo(_config(tmp_path), _quiet(), spark=object())
    assert ran == ["signalled", "first stop"]


def test_errors_pidfence_does_not_name_become_one_demo_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    def kafka_refused() -> None:
        raise RuntimeError("KafkaError{code=TOPIC_AUTHORIZATION_FAILED}")

    monkeypatch.setattr(runner_module, "start_services", _services([], ran, kafka_refused))
    with pytest.raises(DemoFailed, match="RuntimeError: KafkaError"):
        run_demo(_config(tmp_path), _quiet(), spark=object())
    assert ran == ["second stop", "first stop"]


def test_the_spark_session_it_started_is_stopped_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = object()
    stopped: list[Any] = []
    monkeypatch.setattr(runner_module, "_spark", lambda *args: session)
    monkeypatch.setattr(runner_module, "stop_session", stopped.append)
    monkeypatch.setattr(runner_module, "start_services", _services([], []))
    _no_metrics(monkeypatch)
    monkeypatch.setattr(runner_module, "produce", lambda *args: SimpleNamespace())
    monkeypatch.setattr(runner_module, "_sink_pass", lambda *args: {"pass": 1})
    monkeypatch.setattr(runner_module, "collect", lambda record: {"ok": True})
    monkeypatch.setattr(runner_module, "write_report", lambda *args: None)
    summary = run_demo(_config(tmp_path), _quiet())
    assert summary["ok"]
    assert stopped == [session]


def test_stop_signals_defer_then_raise_what_came() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signals = StopSignals()
    signals.unwind()
    with pytest.raises(Stopped):
        os.kill(os.getpid(), signal.SIGTERM)
    signals.defer()
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    signals.restore()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    with pytest.raises(KeyboardInterrupt):  # the first one that came
        signals.raise_deferred()
    signals.raise_deferred()  # raised once


def test_keep_running_names_only_the_services_this_run_started() -> None:
    from pidfence.demo.runner import kept_services

    # --bootstrap/--zk: no zookeeper or kafka pid recorded, none claimed.
    assert kept_services({"lease-0": 1, "lease-1": 2, "toxiproxy": 3}) == "lease (2), toxiproxy (1)"
    assert kept_services({"zookeeper-0": 1, "kafka-0": 2, "seaweedfs-0": 3}) == (
        "zookeeper (1), kafka (1), seaweedfs (1)"
    )
