"""Spark sessions with the Kafka connector matched to pyspark, and a local standalone cluster."""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import json
import os
import re
import shlex
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple, Self
from urllib.parse import urlsplit

from pidfence.jars import connector_jars as connector_jar_paths
from pidfence.jars import require_java, user_cache
from pidfence.services.class_archive import archive_options
from pidfence.services.node import ProcessGroup
from pidfence.services.ports import free_port
from pidfence.services.process import ManagedProcess, jvm_options, wait_until


def spark_home() -> Path:
    """The pyspark distribution (it carries ``bin/spark-class`` and Spark's jars)."""
    import pyspark

    return Path(pyspark.__file__).parent


def connector_jars(folder: str | Path | None = None) -> str:
    """``spark.jars`` value: the Kafka connector and what pyspark lacks
    (:func:`pidfence.jars.connector_jars`: from ``folder``, else fetched into the cache)."""
    return ",".join(str(p) for p in connector_jar_paths(folder))


def driver_classpath_identity(extra_classpath: str = "") -> str:
    """What the driver JVM loads its classes from: pyspark's jars, the connector's and
    ``spark.driver.extraClassPath`` (the key of its class archive,
    :mod:`pidfence.services.class_archive`).

    The extra class path (the S3A jars of an ``s3://`` run) comes first on the driver's class
    path, and the JVM maps an archive only onto the class path it was recorded with: a run on the
    object store has an archive of its own.
    """
    import pyspark

    identity = f"{spark_home() / 'jars'} {pyspark.__version__}\n{connector_jars()}"
    return f"{identity}\n{extra_classpath}" if extra_classpath else identity


def _zips_spark_prepends() -> list[str]:
    """The source-only zips Spark puts first on its Python workers' path (``sparkPythonPath``)."""
    lib = spark_home() / "python" / "lib"
    return [str(lib / "pyspark.zip"), *(str(p) for p in sorted(lib.glob("py4j-*-src.zip")))]


def worker_python_script(exec_line: str) -> str:
    """A ``/bin/sh`` script for ``PYSPARK_PYTHON`` that runs ``exec_line`` (which ends with
    ``"$@"``) with pyspark imported from site-packages, compiled.

    Spark puts ``pyspark.zip`` and py4j's zip first on every Python worker's path; they hold
    sources only, so each worker compiled pyspark again (0.7 CPU s per process, about 7 per
    ``pidfence sink`` run). This interpreter has the same pyspark installed, with its bytecode.
    """
    drop = " ".join(f"-e {shlex.quote(z)}" for z in _zips_spark_prepends())
    return (
        "#!/bin/sh\n"
        "# Spark's source-only zips off the path: the same pyspark is installed here, compiled.\n"
        f"PYTHONPATH=$(printf '%s' \"$PYTHONPATH\" | tr : '\\n' | grep -vxF {drop}"
        " | paste -sd: -)\n"
        "export PYTHONPATH\n"
        f"{exec_line}\n"
    )


def worker_python() -> str:
    """The executable for Spark's Python workers: this interpreter, importing the installed,
    compiled pyspark (:func:`worker_python_script`). Written once to ``~/.cache/pidfence``."""
    text = worker_python_script(f'exec {shlex.quote(sys.executable)} "$@"')
    folder = user_cache()
    path = folder / f"python-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if not path.exists():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(text)
        partial.chmod(0o755)
        partial.replace(path)  # whole or absent for a process reading it beside us
    return str(path)


#: Spark's own log4j2 configuration when its output goes to a file: WARN and above only.
SPARK_LOG4J2 = """status = error
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_ERR
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
"""


#: The driver's address when every executor runs on this machine.
LOOPBACK: Final = "127.0.0.1"
#: What names the machine's own address to Spark (it then chooses the driver's from it).
_LOCAL_ADDRESS_ENV: Final = ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME")


class DriverAddress(NamedTuple):
    """Where a session's driver listens: environment defaults and Spark settings (both empty:
    Spark's own choice, the machine's address)."""

    env: dict[str, str]
    conf: dict[str, str]


def _on_loopback(hostport: str) -> bool:
    """Whether ``HOST[:PORT]`` (an IPv6 host in brackets) names this machine's loopback."""
    try:
        host = urlsplit(f"spark://{hostport.strip()}").hostname
        return host == "localhost" or (host is not None and ipaddress.ip_address(host).is_loopback)
    except ValueError:  # a name, or no URL at all: Spark says what it makes of it
        return False


def executors_are_local(master: str) -> bool:
    """Whether every executor of ``master`` runs on this machine: a ``local...`` master, or a
    standalone ``spark://`` master (each of an HA list) on a loopback address."""
    if master.startswith("local"):
        return True
    if not master.startswith("spark://"):
        return False
    return all(_on_loopback(h) for h in master.removeprefix("spark://").split(","))


def driver_address(master: str, environ: Mapping[str, str]) -> DriverAddress:
    """The driver pinned to loopback for a master whose executors all run on this machine
    (no lookup of the machine's name, no port open to the network), unless ``environ`` names
    the machine's address itself. Any other master (``spark://`` elsewhere, ``yarn``,
    ``k8s://``) gets Spark's own choice: its executors on other hosts connect back to the
    driver, which an address of 127.0.0.1 would send to themselves."""
    if not executors_are_local(master) or any(environ.get(k) for k in _LOCAL_ADDRESS_ENV):
        return DriverAddress({}, {})
    pinned = {"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK}
    return DriverAddress({"SPARK_LOCAL_IP": LOOPBACK}, pinned)


def spark_session(
    master: str = "local[2]",
    app_name: str = "pidfence",
    conf: dict[str, str] | None = None,
    log_file: Path | None = None,
    jars: str | Path | None = None,
) -> Any:
    """A SparkSession that can read Kafka, with the connector matched to the installed pyspark.

    Args:
        master: ``local[N]``, ``local[N,F]`` (F task attempts), ``spark://host:port``,
            ``yarn`` or ``k8s://...``; the driver listens on loopback only when every executor
            runs on this machine (:func:`driver_address`).
        app_name: shown in Spark's UI and logs.
        conf: extra Spark settings (override the defaults here).
        log_file: send everything the driver JVM prints (Spark's log4j at WARN, the JVM's own
            warnings, Python workers' stderr) to this file instead of the terminal. Takes effect
            only when this call starts the JVM (the first session of the process).
        jars: a folder holding the connector's jars (else ``$PIDFENCE_JARS``, else the jar
            cache, fetched from Maven Central on first use).
    """
    from pyspark.sql import SparkSession

    require_java()  # a clear error, where pyspark's launcher would only say the gateway exited
    # Workers must run this interpreter (the venv's pyarrow, msgpack and pidfence).
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    address = driver_address(master, os.environ)
    for key, value in address.env.items():
        os.environ.setdefault(key, value)
    settings = {
        "spark.jars": connector_jars(jars),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        **address.conf,
        "spark.driver.memory": "1g",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.python.worker.reuse": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **(conf or {}),
    }
    if extra := " ".join(jvm_options()):
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            settings[key] = f"{settings[key]} {extra}" if settings.get(key) else extra
    identity = driver_classpath_identity(settings.get("spark.driver.extraClassPath", ""))
    if driver := " ".join(archive_options("spark", identity)):
        key = "spark.driver.extraJavaOptions"
        settings[key] = f"{settings[key]} {driver}" if settings.get(key) else driver
    if log_file is not None:
        _launch_gateway_logging_to(
            log_file, {"spark.master": master, "spark.app.name": app_name}, settings
        )
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _quiet_accumulator_eof(session.sparkContext)
    return session


#: errno values of a failed start that may pass later: the disk, memory or processes short.
_TRANSIENT_ERRNOS: Final = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ENOMEM}
)
#: A cluster manager (standalone master, YARN, Kubernetes) that did not answer the driver.
_UNANSWERED: Final = re.compile(
    r"java\.net\.(?:Connect|NoRouteToHost|SocketTimeout)Exception|All masters are unresponsive"
)


def start_failure_is_transient(exc: BaseException) -> bool:
    """Whether a :func:`spark_session` that raised ``exc`` may start when called again: an
    ``OSError`` of a disk, memory or process table short for now, or a cluster manager that
    did not answer. Anything else is met again: a master or JVM option Spark refuses (the
    gateway exits before it answers), an unwritable folder, a broken installation."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _TRANSIENT_ERRNOS:
            return True
        try:
            text = str(current)
        except Exception:  # noqa: BLE001 - py4j asks the JVM for the text, which may be gone
            text = ""
        if _UNANSWERED.search(text):
            return True
        current = current.__cause__ or current.__context__
    return False


def _quiet_accumulator_eof(context: Any) -> None:
    """No traceback when the JVM closes its accumulator connection first.

    pyspark's accumulator server reads updates from the driver JVM over one connection; when the
    JVM closes it (while it stops, sometimes before :func:`stop_session` has shut the server
    down), the handler reads EOF and ``socketserver`` prints the ``EOFError`` traceback to the
    run's output. pidfence registers no accumulators, so that EOF loses nothing; any other error
    is still printed.
    """
    server = getattr(context, "_accumulatorServer", None)
    if server is None or getattr(server, "_pidfence_quiet_eof", False):
        return
    default = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], EOFError):
            return
        default(request, client_address)

    server.handle_error = handle_error
    server._pidfence_quiet_eof = True


def stop_session(spark: Any) -> None:
    """Stop a SparkSession without pyspark's ``EOFError`` traceback on stderr.

    ``SparkContext.stop()`` stops the JVM before the Python accumulator server; when the JVM
    closes its accumulator connection first, the server's handler reads EOF and prints a
    traceback. Shutting the server down first (its handler ends within a second) avoids it.
    """
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.shutdown()
    spark.stop()


def stop_driver_jvm(timeout: float = 60.0) -> None:
    """Stop the driver JVM pyspark launched in this process, by its pid, and wait for it.

    ``SparkSession.stop()`` leaves that JVM running until the interpreter exits (it ends when its
    stdin closes); a test session stops it at its end instead, so nothing it started outlives it
    and no py4j connection is left to close during interpreter shutdown. Call it after the last
    session of the process is stopped; a later ``spark_session()`` launches a new JVM.
    """
    import subprocess

    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    gateway.close()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None:
        return
    if proc.stdin is not None:
        proc.stdin.close()  # Spark's PythonGatewayServer exits at end of input
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _launch_gateway_logging_to(
    log_file: Path, launch: dict[str, str], settings: dict[str, str]
) -> None:
    """Start the driver JVM with its stdout and stderr in ``log_file`` and log4j at WARN.

    pyspark starts the JVM lazily with the terminal's file descriptors; starting it here first,
    with ``popen_kwargs``, is pyspark's documented way to capture that output. Python's own
    ``py4j`` and ``pyspark`` loggers go to the same file.
    """
    import logging

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    log_file.parent.mkdir(parents=True, exist_ok=True)
    config = log_file.with_name(log_file.stem + "-log4j2.properties")
    config.write_text(SPARK_LOG4J2)
    option = f"-Dlog4j2.configurationFile=file:{config}"
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        settings[key] = f"{settings[key]} {option}" if settings.get(key) else option
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("py4j", "pyspark"):
        logger = logging.getLogger(name)
        if not any(
            getattr(h, "baseFilename", None) == handler.baseFilename for h in logger.handlers
        ):
            logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
    if SparkContext._gateway is not None:
        return
    spark_conf = SparkConf(loadDefaults=False)
    for key, value in {**launch, **settings}.items():
        spark_conf.set(key, value)
    with log_file.open("ab") as out:
        gateway = launch_gateway(  # type: ignore[no-untyped-call]
            spark_conf, popen_kwargs={"stdout": out, "stderr": out}
        )
    SparkContext._ensure_initialized(gateway=gateway)


class SparkStandaloneCluster(ProcessGroup[ManagedProcess]):
    """A Spark standalone master and ``workers`` workers on 127.0.0.1 (pyspark's spark-class)."""

    def __init__(
        self, workers: int = 2, run_dir: Path | None = None, worker_memory: str = "1g"
    ) -> None:
        super().__init__(run_dir, "pidfence-spark-")
        self.workers = workers
        self.port = free_port()
        self.ui_port = free_port()
        self.worker_memory = worker_memory

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``."""
        return f"spark://127.0.0.1:{self.port}"

    def work_dir(self, i: int) -> Path:
        """Worker ``i``'s working folder (its executors' files)."""
        return self.run_dir / f"work{i}"

    def _env(self) -> dict[str, str]:
        return {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.run_dir / "logs"),
            "PYSPARK_PYTHON": worker_python(),
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_DAEMON_JAVA_OPTS": " ".join(jvm_options()),
        }

    def start(self, timeout: float = 120.0) -> Self:
        """Start the master and workers; return once every worker is ALIVE."""
        spark_class = str(spark_home() / "bin" / "spark-class")
        env = self._env()
        master = ManagedProcess(
            "spark-master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
            self.run_dir / "master.log",
            env=env,
        )
        self.nodes.append(master)
        for i in range(self.workers):
            self.nodes.append(
                ManagedProcess(
                    f"spark-worker-{i}",
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--webui-port",
                        str(free_port()),
                        "--cores",
                        "1",
                        "--memory",
                        self.worker_memory,
                        # Each worker a folder of its own: machines that share no disk.
                        "--work-dir",
                        str(self.work_dir(i)),
                        self.master_url,
                    ],
                    self.run_dir / f"worker{i}.log",
                    env=env,
                )
            )
        master.start()
        return self._started(lambda: self._start_workers(master, timeout))

    def _start_workers(self, master: ManagedProcess, timeout: float) -> None:
        wait_until(self._master_up, timeout, "Spark master", tail=master.log_tail())
        for node in self.nodes[1:]:
            node.start()
        wait_until(
            lambda: self.alive_workers() >= self.workers,
            timeout,
            f"{self.workers} Spark workers",
            interval=0.5,
            tail="\n".join(n.log_tail(10) for n in self.nodes),
        )

    def _state(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=3) as response:
            state: dict[str, Any] = json.load(response)
        return state

    def _master_up(self) -> bool:
        return self._state().get("status") == "ALIVE"

    def alive_workers(self) -> int:
        """Workers the master lists as ALIVE."""
        return sum(1 for w in self._state().get("workers", []) if w.get("state") == "ALIVE")

    def running_apps(self) -> list[dict[str, Any]]:
        """Applications the master runs now, as its JSON API lists them (``name``, ``cores``
        granted to their executors, ``state``, ...)."""
        apps: list[dict[str, Any]] = self._state().get("activeapps", [])
        return apps

    def stop(self) -> None:
        """Stop workers, then the master."""
        for node in reversed(self.nodes):
            node.stop()
        self._remove_run_dir()
