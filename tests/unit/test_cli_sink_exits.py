"""`pidfence sink`'s exit codes, without a JVM, Kafka or a store: 75 only where a rerun
continues, 3 for what a rerun meets again, 2 for usage, and never a traceback for a known
failure. Spark, Kafka's client and the Delta tables are replaced at their boundary."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import typer
from confluent_kafka import KafkaError, KafkaException
from deltalake.exceptions import CommitFailedError, DeltaProtocolError
from rich.console import Console
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.cli.exits import EXIT_RETRIABLE, EXIT_UNAVAILABLE, EXIT_USAGE, code_of
from pidfence.cli.preflight import KafkaUnreachable, PreflightError, TopicMissing, check_kafka
from pidfence.cli.spark_master import spark_master
from pidfence.pid_allocator import InvalidServerList, LeaseServerThread, MemoryCoordinator
from pidfence.spark_sink import SinkOptionError, pipeline
from pidfence.wire import PidfenceError
from tests.unit.test_sink_release import DeadJvmQuery, FakeClaim, FinishingQuery, jvm_gone

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------ the driver's address


class _Builder:
    """SparkSession.builder: records the master and settings; its session does nothing."""

    def __init__(self) -> None:
        self.conf: dict[str, str] = {}

    def master(self, url: str) -> _Builder:
        return self

    def appName(self, name: str) -> _Builder:
        return self

    def config(self, key: str, value: str) -> _Builder:
        self.conf[key] = value
        return self

    def getOrCreate(self) -> Any:
        return SimpleNamespace(sparkContext=SimpleNamespace(setLogLevel=lambda level: None))


_ADDRESS_ENV = ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


@pytest.fixture
def no_jvm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """spark_session() up to the builder: no Java check, jar fetch, class archive or JVM; the
    environment it sets is put back afterwards."""
    from pidfence.services import spark

    for name in _ADDRESS_ENV:
        monkeypatch.setenv(name, "")  # recorded, so what the call sets is undone
        monkeypatch.delenv(name)
    monkeypatch.delenv("PIDFENCE_JVM_OPTIONS", raising=False)
    monkeypatch.setattr(spark, "require_java", lambda: None)
    monkeypatch.setattr(spark, "worker_python", lambda: "/usr/bin/python3")
    monkeypatch.setattr(spark, "connector_jars", lambda folder=None: "/jars/kafka.jar")
    monkeypatch.setattr(spark, "driver_classpath_identity", lambda extra="": "classes")
    monkeypatch.setattr(spark, "archive_options", lambda name, identity: [])
    yield


def _settings(monkeypatch: pytest.MonkeyPatch, master: str, **kwargs: Any) -> dict[str, str]:
    """The Spark settings spark_session(master) hands the builder."""
    from pidfence.services import spark_session

    builder = _Builder()
    monkeypatch.setattr("pyspark.sql.SparkSession", SimpleNamespace(builder=builder))
    spark_session(master, **kwargs)
    return builder.conf


#: master -> whether every executor runs on this machine (then the driver is on loopback).
MASTERS = {
    "local[*]": True,
    "local[2,3]": True,
    "local-cluster[2,1,1024]": True,
    "spark://127.0.0.1:7077": True,
    "spark://localhost:7077": True,
    "spark://[::1]:7077": True,
    "spark://127.0.0.1:7077,127.0.0.1:7078": True,
    "spark://10.0.0.5:7077": False,
    "spark://spark-master.example:7077": False,
    "spark://127.0.0.1:7077,10.0.0.5:7077": False,
    "yarn": False,
    "k8s://https://127.0.0.1:6443": False,
}


@pytest.mark.usefixtures("no_jvm")
def test_the_driver_is_on_loopback_only_when_every_executor_runs_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every master got spark.driver.host=127.0.0.1: executors of a cluster elsewhere were told
    to connect to themselves, and the query hung or failed with exit 75, rerun forever."""
    for master, local in MASTERS.items():
        monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
        conf = _settings(monkeypatch, master)
        pinned = {k: conf.get(k) for k in ("spark.driver.host", "spark.driver.bindAddress")}
        expected = "127.0.0.1" if local else None
        assert pinned == dict.fromkeys(pinned, expected), master
        assert os.environ.get("SPARK_LOCAL_IP") == expected, master


@pytest.mark.usefixtures("no_jvm")
def test_the_users_environment_and_conf_name_the_drivers_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SPARK_LOCAL_IP set by the user was overridden by a pinned spark.driver.host."""
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    conf = _settings(monkeypatch, "local[2]")
    assert "spark.driver.host" not in conf and "spark.driver.bindAddress" not in conf
    assert os.environ["SPARK_LOCAL_IP"] == "10.1.2.3"
    monkeypatch.delenv("SPARK_LOCAL_IP")
    mine = {"spark.driver.host": "10.9.9.9", "spark.driver.bindAddress": "10.9.9.9"}
    for master in ("local[2]", "spark://10.0.0.5:7077"):
        conf = _settings(monkeypatch, master, conf=mine)
        assert {k: conf[k] for k in mine} == mine, master


# ------------------------------------------------------------------ Spark's start


def _run(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    master: str = "local[1]",
    stop_session: Callable[[Any], None] = lambda spark: None,
) -> int:
    """``pidfence sink``'s run after its checks (Spark's start, then the query; the JVM's log to
    a file, as without ``--verbose``); its exit code."""
    from pidfence.cli import sink

    monkeypatch.setattr("signal.signal", lambda signum, handler: None)
    monkeypatch.setattr("pidfence.services.stop_session", stop_session)
    out, ckpt, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "spark.log"
    with pytest.raises(typer.Exit) as info:
        sink._run(Console(), master, "b:9092", "t", str(out), str(ckpt), log, None, {})
    return info.value.exit_code


def _start_fails(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    def refused(**kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr("pidfence.services.spark_session", refused)


@pytest.mark.usefixtures("no_jvm")
@pytest.mark.parametrize(
    ("failure", "says"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "/home/u/.cache/pidfence"), "denied"),
        (ValueError("No closing quotation"), "No closing quotation"),
    ],
)
def test_a_spark_start_a_rerun_meets_again_exits_3_with_its_cause(
    failure: Exception,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An unwritable cache folder (the workers' Python script) or a PIDFENCE_JVM_OPTIONS that
    does not parse exited 75 ("Spark did not start"): a supervisor reran it forever."""
    from pidfence.services import spark

    if isinstance(failure, OSError):

        def unwritable() -> str:
            raise failure

        monkeypatch.setattr(spark, "worker_python", unwritable)
    else:
        monkeypatch.setenv("PIDFENCE_JVM_OPTIONS", '-Dx="unclosed')
    assert _run(monkeypatch, tmp_path) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "error: Spark did not start" in err and says in err
    assert "Traceback" not in err


def test_a_master_spark_refuses_at_start_exits_3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Spark's launcher refuses a master or JVM option by exiting before it answers."""
    from pyspark.errors import PySparkRuntimeError

    _start_fails(
        monkeypatch, PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})
    )
    assert _run(monkeypatch, tmp_path) == EXIT_UNAVAILABLE
    assert "JAVA_GATEWAY_EXITED" in capsys.readouterr().err


def test_only_a_start_failure_that_passes_exits_75(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A full disk or a cluster manager that did not answer: a rerun may start (75); a
    refusal (3) does not (it was 75 for every one)."""
    cases: list[tuple[BaseException, int]] = [
        (OSError(errno.ENOSPC, "No space left on device"), EXIT_RETRIABLE),
        (
            RuntimeError(
                "An error occurred while calling None.JavaSparkContext.\n"
                ": java.net.ConnectException: Call From d/10.0.0.1 to rm:8032 failed on "
                "connection exception: Connection refused"
            ),
            EXIT_RETRIABLE,
        ),
        (RuntimeError("All masters are unresponsive! Giving up."), EXIT_RETRIABLE),
        (
            RuntimeError("Master must either be yarn or start with spark, k8s, or local"),
            EXIT_UNAVAILABLE,
        ),
        (FileNotFoundError(errno.ENOENT, "No such file", "spark-submit"), EXIT_UNAVAILABLE),
    ]
    for failure, code in cases:
        _start_fails(monkeypatch, failure)
        assert _run(monkeypatch, tmp_path) == code, failure


@pytest.mark.parametrize("master", ["mesos://h:5050", "mesos://zk://h:2181/mesos"])
def test_mesos_is_not_a_master_spark_4_accepts(master: str) -> None:
    """Spark 4 refuses mesos:// ("Master must either be yarn or start with spark, k8s, or
    local"): the option passed, and the refusal came as a failed start."""
    with pytest.raises(typer.BadParameter, match="not a Spark master URL"):
        spark_master(master)


def test_yarn_is_a_master_whatever_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """spark-submit may find HADOOP_CONF_DIR in spark-env.sh: yarn is not refused up front."""
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    assert spark_master("yarn") == "yarn"


# ------------------------------------------------------------------ usage before anything


def _invoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *extra: str) -> Any:
    """``pidfence sink`` with ``extra``; Kafka, if asked, is found unreachable at once (exit 3)."""

    def unreachable(bootstrap: str, topics: list[str]) -> Any:
        raise KafkaUnreachable(f"cannot reach Kafka at {bootstrap}")

    monkeypatch.setattr("pidfence.cli.preflight.check_kafka", unreachable)
    argv = ["sink", "--bootstrap", "127.0.0.1:1", "--topic", "t"]
    argv += ["--output", str(tmp_path / "o"), "--checkpoint", str(tmp_path / "c"), *extra]
    return CliRunner().invoke(app, argv)


def test_available_now_with_a_trigger_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The trigger was ignored without a word."""
    result = _invoke(monkeypatch, tmp_path, "--available-now", "--trigger", "5")
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--available-now" in result.output and "--trigger" in result.output
    with pytest.raises(SinkOptionError, match="--trigger"):
        pipeline.build_query(None, "b", "t", "/o", "/c", available_now=True, trigger_seconds=5)


def test_a_lease_server_without_its_port_is_a_usage_error() -> None:
    """InvalidServerList was not in the exit table: exit 3, as for a server that is down."""
    assert code_of(InvalidServerList("lease server 'host' is not HOST:PORT")) == EXIT_USAGE


def test_a_lifetime_shorter_than_the_lease_servers_is_a_usage_error_before_kafka(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The sink's lifetime below the lease servers' was documented, not enforced: the sink
    forgot producers whose lease was live."""
    with LeaseServerThread(None, coordinator=MemoryCoordinator(), lifetime_ms=7_200_000) as srv:
        short = _invoke(monkeypatch, tmp_path, "--lease-server", srv.address, "--lifetime", "1h")
        enough = _invoke(monkeypatch, tmp_path, "--lease-server", srv.address, "--lifetime", "2h")
    assert short.exit_code == EXIT_USAGE, short.output
    assert "lifetime=1h is shorter than the lease servers' lease lifetime (2h)" in short.output
    assert "Kafka" not in short.output  # refused before anything else was asked
    assert enough.exit_code == 3 and "cannot reach Kafka" in enough.output, enough.output


def test_every_other_sink_option_is_an_option_flag_checked_before_kafka(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Twelve sink options had no flag: the standby line told a user to change claimLapse, and
    docs/sink.md to raise timestampSkew, which the command could not set."""
    with LeaseServerThread(None, coordinator=MemoryCoordinator(), lifetime_ms=7_200_000) as srv:
        short = _invoke(
            monkeypatch, tmp_path, "--lease-server", srv.address, "--option", "LIFETIME=1h"
        )
    assert short.exit_code == EXIT_USAGE, short.output
    assert "lifetime=1h is shorter than the lease servers'" in short.output
    refused = {
        "claimLapse=0s": "claimLapse",  # below its bound: parsed as the sink parses it
        "claimLapse": "give NAME=VALUE",
        "nosuch=1": "give NAME=VALUE with NAME one of lifetime",
        "epoch=4": "give NAME=VALUE",  # the command's own
    }
    for given, said in refused.items():
        result = _invoke(monkeypatch, tmp_path, "--option", given)
        assert result.exit_code == EXIT_USAGE and said in result.output, (given, result.output)
        assert "Kafka" not in result.output
    twice = _invoke(monkeypatch, tmp_path, "--lifetime", "3h", "--option", "lifetime=2h")
    assert twice.exit_code == EXIT_USAGE and "given twice" in twice.output, twice.output
    passed = _invoke(
        monkeypatch, tmp_path, "--option", "claimLapse=2m", "--option", "flushHeld=true"
    )
    assert passed.exit_code == 3 and "cannot reach Kafka" in passed.output, passed.output


def test_the_docs_synopsis_names_one_mac_secret_file_and_one_pace() -> None:
    """docs/sink.md showed --record-mac-secret FILE[,FILE] (a,b exits 2), and the two paces
    side by side."""
    page = (ROOT / "docs" / "sink.md").read_text()
    assert "[--record-mac-secret FILE]" in page
    assert "[--available-now | --trigger SECONDS]" in page


# ------------------------------------------------------------------ the store around the query


DEAD_STORE = "AWS Error NETWORK_CONNECTION during GetObject operation"


def _dead_store(*args: Any, **kwargs: Any) -> Any:
    raise OSError(DEAD_STORE)


def _spark_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pidfence.services.spark_session", lambda **kwargs: object())


def _assert_store_line(code: int, err: str, output: str) -> None:
    assert code == EXIT_RETRIABLE, err
    assert "retriable:" in err and output in err and "NETWORK_CONNECTION" in err
    assert "did not start" not in err and "Traceback" not in err


def test_a_store_that_fails_after_the_claim_exits_75_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reading the committed batches once the claim is held: the OSError came out as "the
    Spark query did not start", exit 3, for a store that blipped."""
    claim = FakeClaim()
    monkeypatch.setattr(
        "pidfence.spark_sink.preflight.check_output", lambda opts, ckpt: SimpleNamespace(own=None)
    )
    monkeypatch.setattr(pipeline, "claim_output", lambda *args: claim)
    monkeypatch.setattr("pidfence.spark_sink.output.Output.reading", classmethod(_dead_store))
    _spark_starts(monkeypatch)
    code = _run(monkeypatch, tmp_path)
    _assert_store_line(code, capsys.readouterr().err, str(tmp_path / "out"))
    assert claim.released


@pytest.mark.parametrize("step", ["last poll", "summary"])
def test_a_store_that_fails_after_every_batch_committed_exits_75(
    step: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The query ended cleanly; the last look at the committed batches, or their summary,
    met the store down: "the Spark query did not start", exit 3, when every batch had
    committed."""
    started = pipeline.Started(FinishingQuery(polls=0), cast(Any, FakeClaim()), -1)
    monkeypatch.setattr(pipeline, "_start", lambda *args, **kwargs: started)

    def poll(self: Any, query: Any, final: bool = False) -> list[Any]:
        if step == "last poll" and final:
            raise OSError(DEAD_STORE)
        return []

    monkeypatch.setattr(pipeline.BatchWatcher, "poll", poll)
    monkeypatch.setattr(pipeline, "summarise", _dead_store)
    _spark_starts(monkeypatch)
    code = _run(monkeypatch, tmp_path)
    _assert_store_line(code, capsys.readouterr().err, str(tmp_path / "out"))


def test_a_driver_jvm_that_died_mid_run_exits_75(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed or out of memory, the JVM answers nothing: not the query, not the last look at
    the batches, not the session's stop. The query failed and a rerun continues from the
    checkpoint: 75, where the stop's or the clean-up's error escaped (exit 1, or 3 "did not
    start")."""
    started = pipeline.Started(DeadJvmQuery(), cast(Any, FakeClaim()), -1)
    monkeypatch.setattr(pipeline, "_start", lambda *args, **kwargs: started)
    monkeypatch.setattr(pipeline.BatchWatcher, "poll", jvm_gone)
    _spark_starts(monkeypatch)
    code = _run(monkeypatch, tmp_path, stop_session=jvm_gone)
    err = capsys.readouterr().err
    assert code == EXIT_RETRIABLE, err
    assert "Answer from Java side is empty" in err and "did not start" not in err


def test_the_store_failing_after_a_clean_run_is_the_sinks_retriable_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = pipeline.Started(FinishingQuery(polls=0), cast(Any, FakeClaim()), -1)
    monkeypatch.setattr(pipeline, "_start", lambda *args, **kwargs: started)
    monkeypatch.setattr(pipeline.BatchWatcher, "poll", lambda self, q, final=False: [])
    monkeypatch.setattr(pipeline, "summarise", _dead_store)
    with pytest.raises(PidfenceError) as caught:
        pipeline.serve(
            None, "b", "t", "s3://lake/out", "/c", on_batch=print, stop=threading.Event()
        )
    assert caught.value.retriable and "s3://lake/out" in str(caught.value)


# ------------------------------------------------------------------ Kafka's answers


class _Consumer:
    """A consumer whose metadata lists topic ``t`` with ``ERROR`` and partition 0, whose
    offsets raise ``OFFSETS`` (a KafkaError, or None: answered)."""

    ERROR: KafkaError | None = None
    OFFSETS: KafkaError | None = None

    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def list_topics(self, timeout: float) -> Any:
        topic = SimpleNamespace(error=self.ERROR, partitions={0: object()})
        return SimpleNamespace(topics={"t": topic, "other": topic})

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        if self.OFFSETS is not None:
            raise KafkaException(self.OFFSETS)
        return 0, 0

    def close(self) -> None:
        pass


def _kafka(
    monkeypatch: pytest.MonkeyPatch, error: int | None = None, offsets: int | None = None
) -> PidfenceError:
    class Consumer(_Consumer):
        ERROR = None if error is None else KafkaError(error)
        OFFSETS = None if offsets is None else KafkaError(offsets)

    monkeypatch.setattr("pidfence.cli.preflight.refused_everywhere", lambda servers: False)
    monkeypatch.setattr("confluent_kafka.Consumer", Consumer)
    with pytest.raises(PidfenceError) as caught:
        check_kafka("b:9092", ["t"], timeout_s=0.1)
    return caught.value


@pytest.mark.parametrize(
    "offsets", [KafkaError.LEADER_NOT_AVAILABLE, KafkaError._TIMED_OUT, KafkaError._TRANSPORT]
)
def test_a_partition_without_a_leader_is_kafka_not_ready_exit_75(
    offsets: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get_watermark_offsets raised KafkaException for a partition whose broker is down: a
    traceback, exit 1."""
    error = _kafka(monkeypatch, offsets=offsets)
    assert isinstance(error, KafkaUnreachable) and code_of(error) == EXIT_RETRIABLE
    assert "'t' partition 0" in str(error) and KafkaError(offsets).name() in str(error)


def test_kafkas_answer_for_a_topic_is_reported_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Any metadata error read as "does not exist; create it first" (exit 3), a leader
    election included; now only UNKNOWN_TOPIC_OR_PART does."""
    cases = [
        (KafkaError.LEADER_NOT_AVAILABLE, None, EXIT_RETRIABLE),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, None, EXIT_UNAVAILABLE),
        (None, KafkaError.TOPIC_AUTHORIZATION_FAILED, EXIT_UNAVAILABLE),
    ]
    for error, offsets, code in cases:
        found = _kafka(monkeypatch, error=error, offsets=offsets)
        name = KafkaError(cast(int, error or offsets)).name()
        assert isinstance(found, PreflightError) and code_of(found) == code, name
        assert name in str(found) and "does not exist" not in str(found)
    missing = _kafka(monkeypatch, error=KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert isinstance(missing, TopicMissing) and "create it first" in str(missing)


# ------------------------------------------------------------------ sink compact, sink vacuum


def _care(
    monkeypatch: pytest.MonkeyPatch, command: str, failure: BaseException, where: str = "table"
) -> Any:
    """``pidfence sink COMMAND /out`` with the table step (or the bookkeeping sweep) failing."""
    from pidfence.spark_sink.delta import care

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise failure

    monkeypatch.setattr("pidfence.spark_sink.s3_requests.reach_stores", lambda *paths: None)
    monkeypatch.setattr(care, "tables_of", lambda path, rejects=None: [("log", path)])
    monkeypatch.setattr(care, command, fails if where == "table" else lambda *a, **k: [])
    monkeypatch.setattr("pidfence.spark_sink.sweep.sweep", fails)
    return CliRunner().invoke(app, ["sink", command, "/out"])


CONFLICT = CommitFailedError("Transaction failed: a concurrent transaction deleted the same data")
STORE_DOWN = OSError("Generic S3 error: Error performing GET http://s3:9000/lake: Connection reset")
PROTOCOL = DeltaProtocolError("The table's minimum reader version 4 is not supported")


@pytest.mark.parametrize("command", ["compact", "vacuum"])
@pytest.mark.parametrize(
    ("failure", "code"),
    [(CONFLICT, EXIT_RETRIABLE), (STORE_DOWN, EXIT_RETRIABLE), (PROTOCOL, EXIT_UNAVAILABLE)],
)
def test_a_care_command_exits_by_what_stopped_it(
    command: str, failure: BaseException, code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compact let every DeltaError and store OSError out as a traceback (exit 1); vacuum made
    every DeltaError a usage error (exit 2) and let an OSError out. Now: a commit conflict or
    the store, 75; anything else deltalake refuses, 3; one line naming the table and cause."""
    result = _care(monkeypatch, command, failure)
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit)
    assert f"pidfence sink {command}:" in result.output and "log /out:" in result.output
    assert str(failure).split(":")[0] in result.output


def test_vacuum_whose_sweep_meets_the_store_down_exits_75(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep of PATH/_pidfence let the store's OSError out as a traceback."""
    result = _care(monkeypatch, "vacuum", STORE_DOWN, where="sweep")
    assert result.exit_code == EXIT_RETRIABLE, result.output
    assert "bookkeeping /out/_pidfence:" in result.output and "Connection reset" in result.output
