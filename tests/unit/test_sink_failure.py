"""The error that ended a query is found inside Spark's exception text, by class, not by words."""

from __future__ import annotations

import traceback

import pytest

from pidfence.cli.exits import EXIT_RETRIABLE, EXIT_UNAVAILABLE, code_of
from pidfence.pid_allocator.protocol import RequestRejected
from pidfence.spark_sink.data_loss import DataLost
from pidfence.spark_sink.delta.errors import DeltaCommitConflict, RestoredPastSink
from pidfence.spark_sink.errors import ManifestUnreadable
from pidfence.spark_sink.failure import SparkQueryFailed, failure_of
from pidfence.spark_sink.manifest import BatchManifest


def _traceback_of(error: BaseException) -> str:
    try:
        raise error
    except BaseException as exc:  # noqa: BLE001 - formatting it, as a Python worker does
        return "".join(traceback.format_exception(exc))


class FakeStreamingQueryException(Exception):
    """What pyspark gives: the JVM's text, with the worker's traceback inside."""

    def __init__(self, desc: str) -> None:
        super().__init__(desc)
        self.desc = desc


def _spark_text(worker_traceback: str) -> str:
    return (
        "[STREAM_FAILED] Query [id = 6d0, runId = 1a2] terminated with exception: Job aborted "
        "due to stage failure: Task 0 in stage 3.0 failed 1 times, most recent failure: Lost "
        "task 0.0 in stage 3.0 (TID 3) (127.0.0.1 executor driver): "
        f"org.apache.spark.api.python.PythonException: {worker_traceback}\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException"
    )


def test_the_sinks_error_is_found_and_decides_the_exit_code() -> None:
    line = "/out: version 7 (RESTORE, by x) took the table back to version 3, before batch 4"
    text = _spark_text(_traceback_of(RestoredPastSink(line)))
    found = failure_of(FakeStreamingQueryException(text))
    assert type(found) is RestoredPastSink
    assert str(found) == line
    assert code_of(found) == EXIT_UNAVAILABLE
    retriable = failure_of(
        FakeStreamingQueryException(
            _spark_text(_traceback_of(DeltaCommitConflict("lost 32 races")))
        )
    )
    assert type(retriable) is DeltaCommitConflict and code_of(retriable) == EXIT_RETRIABLE


def test_the_last_pidfence_error_of_a_chain_is_the_cause() -> None:
    try:
        try:
            raise DeltaCommitConflict("first")
        except DeltaCommitConflict as inner:
            raise RestoredPastSink("then this") from inner
    except RestoredPastSink as exc:
        text = "".join(traceback.format_exception(exc))
    found = failure_of(FakeStreamingQueryException(_spark_text(text)))
    assert type(found) is RestoredPastSink and str(found) == "then this"


def test_spark_failures_without_a_sink_error() -> None:
    plain = failure_of(FakeStreamingQueryException("[STREAM_FAILED] executor lost\n\tat x.y(Z)"))
    assert type(plain) is SparkQueryFailed and code_of(plain) == EXIT_RETRIABLE
    assert "executor lost" in str(plain) and "continues from the checkpoint" in str(plain)
    lost = failure_of(
        FakeStreamingQueryException("KAFKA_DATA_LOSS ... Some data may have been lost")
    )
    # Kafka's data loss names the option that continues (exit 3: a rerun meets it again).
    assert type(lost) is DataLost and code_of(lost) == EXIT_UNAVAILABLE
    assert "--allow-data-loss" in str(lost)
    # A name that looks like ours but is no pidfence error is not taken for one.
    fake = failure_of(FakeStreamingQueryException("pidfence.nowhere.Thing: boom"))
    assert type(fake) is SparkQueryFailed


def test_an_error_raised_in_process_is_itself() -> None:
    error = RestoredPastSink("direct")
    assert failure_of(error) is error
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = error
    assert failure_of(wrapped) is error


def test_a_manifest_of_another_version_is_not_retriable() -> None:
    """A rerun reads the same manifest: exit 3, not 75 (a supervisor would restart it forever).
    Before, ``decode`` raised a plain ValueError, which came out as a retriable Spark failure."""
    with pytest.raises(ManifestUnreadable) as caught:
        BatchManifest.decode(b'{"version": 4, "parts": []}')
    error = failure_of(FakeStreamingQueryException(_spark_text(_traceback_of(caught.value))))
    assert isinstance(error, ManifestUnreadable)
    assert "format 4" in str(error) and "new --output" in str(error)
    assert code_of(error) == EXIT_UNAVAILABLE


def test_the_sqlstate_spark_appends_is_not_part_of_the_message() -> None:
    worker = _traceback_of(RestoredPastSink("took the table back")).rstrip("\n")
    found = failure_of(FakeStreamingQueryException(_spark_text(worker + " SQLSTATE: 39000")))
    assert type(found) is RestoredPastSink and str(found) == "took the table back"


def test_a_sink_error_in_the_context_of_another_exception_is_found() -> None:
    """An error raised while handling Spark's, without ``from``, has Spark's as its context."""
    outer = RuntimeError("the query stopped")
    outer.__context__ = FakeStreamingQueryException(
        _spark_text(_traceback_of(RestoredPastSink("back")))
    )
    found = failure_of(outer)
    assert type(found) is RestoredPastSink and str(found) == "back"


def test_an_exception_of_pidfence_that_is_no_pidfence_error_is_sparks_failure() -> None:
    rejected = RequestRejected(7, ValueError("not this way"))
    found = failure_of(FakeStreamingQueryException(_spark_text(_traceback_of(rejected))))
    assert type(found) is SparkQueryFailed
