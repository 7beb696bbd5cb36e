"""Command lines ``pidfence copy`` and ``pidfence produce`` used to accept and then act on
wrongly: a copy into its own input, ``--state`` or the group-only options ignored, and exit 75
(a rerun continues) from a produce that a rerun starts over. No server is asked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from pidfence.cli import app, producer_options
from pidfence.producer.copier import CopySpec
from pidfence.producer.errors import DeliveryTimedOut, LeaseServerDown, ProducerConfigError

ENDS = ("--bootstrap", "127.0.0.1:1", "--lease-server", "127.0.0.1:1")


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Stands in for the producer and the copy behind it: the calls ``copy`` got as far as."""
    calls: list[dict[str, Any]] = []

    def with_producer(*args: Any, **kwargs: Any) -> SimpleNamespace:
        calls.append(kwargs)
        return SimpleNamespace(copied=0, offsets={}, resumed=False, per_partition={})

    monkeypatch.setattr(producer_options, "with_producer", with_producer)
    return calls


def _copy(*options: str, to_topic: str = "out") -> Result:
    argv = ["copy", *ENDS, "--from-topic", "in", "--to-topic", to_topic, *options]
    return CliRunner().invoke(app, argv)


def test_copy_into_its_own_input_is_a_usage_error(
    copies: list[dict[str, Any]], tmp_path: Path
) -> None:
    # Before: accepted, and the copy read back every record it wrote, forever.
    for mode in (("--state", str(tmp_path / "copy.json")), ("--group", "g")):
        result = _copy(*mode, to_topic="in")
        assert result.exit_code == 2, result.output
        assert "--from-topic and --to-topic are both 'in'" in result.output
    assert copies == []


def test_a_copy_spec_into_its_own_input_is_refused() -> None:
    # Before: a library caller's CopySpec("k", "t", "t") copied into its own input.
    with pytest.raises(ProducerConfigError, match="both 'orders'") as info:
        CopySpec("kafka:9092", "orders", "orders")
    assert isinstance(info.value, ValueError)
    assert CopySpec("kafka:9092", "orders", "orders-copy").to_topic == "orders-copy"


@pytest.mark.parametrize("exists", [False, True])
def test_state_with_group_is_a_usage_error_whether_or_not_the_file_exists(
    copies: list[dict[str, Any]], tmp_path: Path, exists: bool
) -> None:
    # Before: a missing file was ignored (the group never wrote it, and a later run without
    # --group copied everything again), an existing one exited 3.
    state = tmp_path / "copy.json"
    if exists:
        state.write_text("{}")
    result = _copy("--state", str(state), "--group", "g")
    assert result.exit_code == 2, result.output
    assert "--group" in result.output
    assert ("single copier's progress" if exists else "--state and --group") in result.output
    assert copies == []
    assert state.exists() == exists


@pytest.mark.parametrize(
    "option",
    [("--group-key", "group.key"), ("--session-timeout", "30"), ("--stop-after-commit", "3")],
)
def test_group_only_options_without_group_are_a_usage_error(
    copies: list[dict[str, Any]], tmp_path: Path, option: tuple[str, str]
) -> None:
    # Before: a single copier ignored them without a word.
    state = ("--state", str(tmp_path / "copy.json"))
    result = _copy(*state, *option)
    assert result.exit_code == 2, result.output
    assert f"{option[0]} only applies to a copier group" in result.output
    assert copies == []
    # With --group they are taken; the options both kinds read are taken without it.
    assert _copy("--group", "g", *option).exit_code == 0
    shared = ("--idle-exit", "1", "--checkpoint-every", "5", "--max-records", "9")
    assert _copy(*state, *shared).exit_code == 0
    assert len(copies) == 2


def test_every_group_only_option_given_is_named(copies: list[dict[str, Any]]) -> None:
    result = _copy("--state", "s.json", "--session-timeout", "30", "--stop-after-commit", "1")
    assert result.exit_code == 2, result.output
    assert "--session-timeout, --stop-after-commit only apply" in result.output


class FailsAfter:
    """A producer that takes ``sent`` records, then times out (retriable) on the next."""

    resumed_from_expired = False
    rollover_due = False

    def __init__(self, sent: int) -> None:
        self.sent = sent

    def produce(self, *args: Any, **kwargs: Any) -> None:
        if not self.sent:
            raise DeliveryTimedOut("Kafka did not answer in time", "MSG_TIMED_OUT")
        self.sent -= 1

    def flush(self, timeout: float | None = None) -> int:
        return 0

    def close(self) -> None:
        pass


@pytest.fixture
def failing_producer(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """``produce`` meets a lease server that is down when it leases its pid (the list empty),
    or a producer that fails after sending as many records as the list's one number."""

    class Client:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    sends: list[int] = []

    def opener(*args: Any, **kwargs: Any) -> Any:
        def open_producer(checkpoint: Any) -> Any:
            if not sends:
                raise LeaseServerDown("no lease server answered (tried 127.0.0.1:1)")
            return FailsAfter(sends[0])

        return open_producer

    monkeypatch.setattr("pidfence.pid_allocator.LeaseClient", Client)
    monkeypatch.setattr("pidfence.producer.opening.open_producer_factory", opener)
    yield sends


PRODUCE = ["produce", *ENDS, "--topic", "t", "--count", "10"]


def test_produce_without_state_exits_3_for_a_retriable_failure_once_it_sent_records(
    failing_producer: list[int],
) -> None:
    # Before: 75, and a supervisor's rerun sent every record again under a new pid.
    failing_producer.append(1)
    alone = CliRunner().invoke(app, PRODUCE)
    assert alone.exit_code == 3, alone.output
    assert "DeliveryTimedOut" in alone.output
    assert "rerun would start over" in alone.output and "--state FILE" in alone.output
    assert "pidfence: error:" in alone.output


def test_produce_exits_75_for_a_retriable_failure_when_a_rerun_continues(
    failing_producer: list[int], tmp_path: Path
) -> None:
    # Nothing sent yet: a rerun without --state starts over, which is where this run was.
    alone = CliRunner().invoke(app, PRODUCE)
    assert alone.exit_code == 75, alone.output
    assert "pidfence: retriable: LeaseServerDown" in alone.output
    assert "start over" not in alone.output
    resumable = CliRunner().invoke(app, [*PRODUCE, "--state", str(tmp_path / "p.json")])
    assert resumable.exit_code == 75, resumable.output
    assert "pidfence: retriable: LeaseServerDown" in resumable.output
    assert "start over" not in resumable.output
