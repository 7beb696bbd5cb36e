"""``make setup``'s last step: record the JVMs' class archives by running a small pipeline once.

``python -m pidfence.services.class_archive_record`` starts ZooKeeper and Kafka, produces a few
hundred records with ``pf`` headers, runs ``pidfence sink --available-now`` over them into a
Delta table, and stops everything cleanly: each JVM writes the classes it loaded at its exit
(:mod:`pidfence.services.class_archive`). When the S3A jars are in the jar cache and SeaweedFS is
installed, a second sink runs beside the first with its output and checkpoint on a SeaweedFS
store: the driver of an ``s3://`` run has the S3A jars first on its class path, so it needs an
archive of its own. It takes about a minute once; every later start of those JVMs is faster. A
failure here only costs speed: JVMs start as they would without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pidfence.jars import classpath
from pidfence.services.class_archive import (
    CLASS_ARCHIVE_ENV,
    archive_dir,
    archive_path,
    recording_path,
)
from pidfence.services.kafka import KafkaCluster, create_topic
from pidfence.services.node import Cluster
from pidfence.services.process import ServiceFailed
from pidfence.services.seaweedfs import SeaweedFS, weed
from pidfence.services.spark import driver_classpath_identity
from pidfence.services.zookeeper import ZooKeeperEnsemble
from pidfence.wire import encode_pf

#: A recording JVM writes its archive at exit (the Spark driver's is ~150 MB, several seconds).
EXIT_LIMIT_S = 180.0
RECORDS_PER_PRODUCER = 100
TOPIC = "pidfence-class-archive"


def _produce(bootstrap: str) -> None:
    from confluent_kafka import Producer

    create_topic(bootstrap, TOPIC, partitions=2)
    # log_level 3: "coordinator load in progress" while the new broker warms up is not news.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 3}
    )
    for pid in (1, 2):
        for seq in range(RECORDS_PER_PRODUCER):
            producer.produce(
                TOPIC,
                value=f"{pid}:{seq}".encode(),
                key=str(pid).encode(),
                partition=pid - 1,
                headers=[("pf", encode_pf(pid, 0, seq))],
            )
    if producer.flush(60):
        raise RuntimeError("class archive: records not delivered to the local Kafka")


def _s3_classpath() -> str | None:
    """The driver's extra class path in an ``s3://`` run, when the S3A jars are already cached and
    SeaweedFS is installed (nothing is fetched here: ``make setup`` fetched the jars before)."""
    from pidfence.jars.cache import cached
    from pidfence.jars.components import hadoop_aws
    from pidfence.spark_sink.object_store import session_conf

    try:
        weed()
    except ServiceFailed:
        return None
    if cached(hadoop_aws()) is None:
        return None
    return session_conf(["s3://"])["spark.driver.extraClassPath"]


def _run_sink(
    bootstrap: str,
    run: Path,
    where: tuple[str, str],
    env: dict[str, str] | None = None,
) -> int:
    """Run the sink once with ``where`` as its output and checkpoint, in ``run`` (a remote
    checkpoint's logs go to the working folder); its process group id (the driver JVM may still be
    writing its archive).

    Raises:
        RuntimeError: the sink failed (its log's tail in the message).
    """
    output, checkpoint = where
    log_path = run / f"sink-{uuid.uuid4().hex[:6]}.log"
    argv = [
        sys.executable,
        "-c",
        "from pidfence.cli import main; main()",
        "sink",
        "--bootstrap",
        bootstrap,
        "--topic",
        TOPIC,
        "--output",
        output,
        "--checkpoint",
        checkpoint,
        "--master",
        "local[2]",
        "--available-now",
        "--starting-offsets",
        "earliest",
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=run,
            env={**os.environ, **(env or {})},
        )
        code = proc.wait(EXIT_LIMIT_S)
    if code != 0:
        _wait_group_gone(proc.pid)
        tail = log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the sink run into {output} exited {code}\n{tail}")
    return proc.pid


def _store_or_none(run: Path, progress: Callable[[str], None]) -> SeaweedFS | None:
    """A started SeaweedFS store with the bucket the ``s3://`` sink writes to; None, said, when it
    does not start (then only the ``s3://`` driver's archive is missing)."""
    store = SeaweedFS(run / "s3")
    try:
        store.start()
        store.make_bucket("cds")
    except Exception as exc:  # noqa: BLE001 - any failure here only costs that one archive
        store.stop()
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        progress(f"class archives: no S3 store ({first}); s3:// runs start without an archive")
        return None
    return store


def _wait_group_gone(pgid: int) -> None:
    deadline = time.monotonic() + EXIT_LIMIT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pgid, signal.SIGKILL)


def _stop_slowly(cluster: Cluster) -> None:
    for node in cluster.nodes:
        node.stop(EXIT_LIMIT_S)
    cluster.stop()


def _publish(application: str, key: str) -> Path | None:
    archive = archive_path(application, key)
    recorded = recording_path(archive)
    if not recorded.is_file():
        return None
    recorded.replace(archive)
    return archive


def record(progress: Callable[[str], None] = print) -> list[Path]:
    """Record every application's archive; the archives written (missing ones failed to dump)."""
    keys = [
        ("zookeeper", classpath("zookeeper")),
        ("kafka", classpath("kafka")),
        ("spark", driver_classpath_identity()),
    ]
    s3_classpath = _s3_classpath()
    if s3_classpath is not None:
        keys.append(("spark", driver_classpath_identity(s3_classpath)))
    archive_dir().mkdir(parents=True, exist_ok=True)
    previous = os.environ.get(CLASS_ARCHIVE_ENV)
    os.environ[CLASS_ARCHIVE_ENV] = "record"
    try:
        with tempfile.TemporaryDirectory(prefix="pidfence-cds-") as tmp:
            run = Path(tmp)
            progress("class archives: starting ZooKeeper and Kafka")
            # Kafka runs in KRaft mode: ZooKeeper is started only to record its own archive, so
            # the two start side by side; the sinks run side by side, and the servers stop side
            # by side while the driver JVMs write.
            kafka = KafkaCluster(1, run / "kafka")
            store = _store_or_none(run, progress) if s3_classpath is not None else None
            clusters: list[Cluster] = [ZooKeeperEnsemble(1, run / "zk"), kafka]
            clusters += [store] if store is not None else []
            with ThreadPoolExecutor(2, thread_name_prefix="pidfence-cds") as pool:
                try:
                    for start in [pool.submit(cluster.start) for cluster in clusters[:2]]:
                        start.result()
                    _produce(kafka.bootstrap)
                    sinks: list[tuple[tuple[str, str], dict[str, str] | None]] = [
                        ((str(run / "out"), str(run / "ckpt")), None)
                    ]
                    if store is not None:
                        sinks.append((("s3://cds/out", "s3a://cds/ckpt"), store.environment()))
                        progress("class archives: running the sink on the local disk and on S3")
                    else:
                        progress("class archives: running the sink once")
                    runs = [pool.submit(_run_sink, kafka.bootstrap, run, *sink) for sink in sinks]
                    # One sink's failure must not cost the other's archive: wait for both.
                    failures = [e for r in runs if (e := r.exception()) is not None]
                    drivers = [r.result() for r in runs if r.exception() is None]
                    stops = [pool.submit(_stop_slowly, cluster) for cluster in clusters]
                    for driver_group in drivers:
                        _wait_group_gone(driver_group)
                    for stop in stops:
                        stop.result()
                    for failure in failures:
                        first = str(failure).splitlines()[0]
                        progress(f"class archives: {first}; that driver's archive is not recorded")
                finally:
                    for cluster in clusters:  # a no-op for a cluster already stopped
                        _stop_slowly(cluster)
    finally:
        if previous is None:
            os.environ.pop(CLASS_ARCHIVE_ENV, None)
        else:
            os.environ[CLASS_ARCHIVE_ENV] = previous
        # What did record is good even when a later step failed.
        written = [a for app, key in keys if (a := _publish(app, key)) is not None]
    return written


def main() -> None:
    """What ``make setup`` runs: record the archives, or say why not and carry on (exit 0)."""
    started = time.monotonic()
    try:
        written = record(lambda line: print(line, flush=True))  # noqa: T201
    except Exception as exc:  # noqa: BLE001 - an archive is an optimisation, never a setup failure
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"note: class archives not recorded ({first}); JVMs start without them")  # noqa: T201
        return
    sizes = ", ".join(f"{a.name.split('-')[0]} {a.stat().st_size // 2**20} MB" for a in written)
    took = time.monotonic() - started
    where = written[0].parent if written else "nowhere"
    print(f"class archives ready in {where} ({sizes}) in {took:.0f} s")  # noqa: T201


if __name__ == "__main__":
    main()
