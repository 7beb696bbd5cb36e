"""A run that ends because its store stopped answering reports the run's failure, not the
store's refusal to take the claim's release (which then lapses)."""

from __future__ import annotations

import logging
import threading
from typing import Any, cast

import pytest

from pidfence.spark_sink.failure import SparkQueryFailed
from pidfence.spark_sink.pipeline import _release


class _DeadStoreClaim:
    def release(self) -> None:
        raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation")


def test_a_release_the_store_refuses_is_logged_and_left_to_lapse(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        _release(cast(Any, _DeadStoreClaim()))
    assert "lapses" in caplog.text and "NETWORK_CONNECTION" in caplog.text


class FinishingQuery:
    """A streaming query that runs for ``polls`` polls, then finishes without an error."""

    def __init__(self, polls: int = 3) -> None:
        self.polls, self.end = 0, polls

    @property
    def isActive(self) -> bool:
        return self.polls < self.end

    def awaitTermination(self, timeout: float | None = None) -> None:
        self.polls += 1

    def stop(self) -> None:
        self.polls = self.end

    def exception(self) -> None:
        return None


class FakeClaim:
    """The sink's claim on its output, as the pipeline uses it (``released`` once let go)."""

    fenced = None
    epoch = 1

    def __init__(self) -> None:
        self.released = False

    def release(self) -> None:
        self.released = True

    def watch(self, query: Any) -> None:
        pass


def test_a_store_that_blips_while_batches_are_reported_does_not_stop_the_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading the committed batches for their lines fails once; the query runs on and the
    run ends as the query did (the failure stopped a healthy query with exit 75 before)."""
    from pidfence.spark_sink import pipeline

    query = FinishingQuery()
    blips = [OSError("AWS Error NETWORK_CONNECTION during GetObject operation")]

    def poll(self: Any, q: Any, final: bool = False) -> list[Any]:
        if blips and not final:
            raise blips.pop()
        return []

    started = pipeline.Started(query, cast(Any, FakeClaim()), -1)
    monkeypatch.setattr(pipeline, "_start", lambda *a, **k: started)
    monkeypatch.setattr(pipeline.BatchWatcher, "poll", poll)
    monkeypatch.setattr(pipeline, "summarise", lambda *a, **k: pipeline.SinkRunSummary())
    stop = threading.Event()
    pipeline.serve(None, "b", "t", "/out", "/ckpt", on_batch=lambda line: None, stop=stop)
    assert not blips and query.polls == 3


def test_a_query_the_dead_store_ended_reports_the_querys_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store died: the query failed on it, and the last look at the committed batches
    fails too. The query's failure is what the run reports (retriable: a rerun continues), not
    the store's OSError from the last look (an exit 3 that stopped the supervisor)."""
    from pidfence.spark_sink import pipeline

    class _Failed(FinishingQuery):
        def exception(self) -> Any:
            return RuntimeError("Job aborted: store unreachable")

    def poll(self: Any, q: Any, final: bool = False) -> list[Any]:
        raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation")

    started = pipeline.Started(_Failed(), cast(Any, FakeClaim()), -1)
    monkeypatch.setattr(pipeline, "_start", lambda *a, **k: started)
    monkeypatch.setattr(pipeline.BatchWatcher, "poll", poll)
    with pytest.raises(SparkQueryFailed) as caught:
        pipeline.serve(None, "b", "t", "/out", "/ckpt", on_batch=print, stop=threading.Event())
    assert caught.value.retriable


def jvm_gone(*args: Any, **kwargs: Any) -> Any:
    """What every call into a driver JVM that died raises."""
    from py4j.protocol import Py4JNetworkError

    raise Py4JNetworkError("Answer from Java side is empty")


class DeadJvmQuery(FinishingQuery):
    """A query whose JVM died after its first poll: every later call fails."""

    @property
    def isActive(self) -> bool:
        return bool(self.polls == 0 or jvm_gone())

    exception = jvm_gone


def test_a_driver_jvm_that_dies_mid_run_is_a_query_failure_a_rerun_continues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The JVM died (killed, out of memory): every call into it fails, the clean-up's and the
    last look at the batches' too. The run reports the query's failure (retriable), where the
    clean-up's own error used to escape and the CLI called it a query that "did not start"
    (exit 3, the supervisor gave up)."""
    from pidfence.spark_sink import pipeline

    claim = FakeClaim()
    started = pipeline.Started(DeadJvmQuery(), cast(Any, claim), -1)
    monkeypatch.setattr(pipeline, "_start", lambda *a, **k: started)
    monkeypatch.setattr(pipeline.BatchWatcher, "poll", jvm_gone)
    with pytest.raises(SparkQueryFailed, match="Answer from Java side is empty") as caught:
        pipeline.serve(None, "b", "t", "/out", "/ckpt", on_batch=print, stop=threading.Event())
    assert caught.value.retriable and claim.released
