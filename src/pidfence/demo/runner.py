"""``pidfence demo``: the whole pipeline on this machine, with faults, ending in the checker.

Order: ZooKeeper and Kafka (embedded), two lease servers, the raw and upstream topics; the Spark
session starts in the background meanwhile. Producers write the raw topic while the fault
scripts kill, pause and restart them; an upstream producer feeds the copier, which is killed
and restarted too. The sink runs (available-now) once while producers still write and once
after they finish, continuing from its checkpoint. Then the checker reads every ledger, the
output log and the rejects. Every process started here is stopped in ``finally``, by pid.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pidfence.demo.config import DemoConfig, Fault
from pidfence.demo.faults import (
    CopierCrash,
    FaultScript,
    KillAndResume,
    LeaseZombie,
    Zombie,
    drive,
)
from pidfence.demo.procs import (
    LeaseServerProc,
    ProducerRole,
    ProducerSpec,
    Worker,
    copier_argv,
    spawn_lease_server,
)
from pidfence.demo.progress import role_line
from pidfence.demo.soak.faults import SelfStoppedLeaseZombie, stop_after
from pidfence.demo.topic import create_topic

UPSTREAM_PRODUCER = "upstream"


@dataclass
class DemoPaths:
    """The files under ``out``."""

    out: Path

    @property
    def ledgers(self) -> Path:
        """One send ledger per producer instance."""
        return self.out / "ledgers"

    @property
    def logs(self) -> Path:
        """One log per process."""
        return self.out / "logs"

    @property
    def state(self) -> Path:
        """Producer and copier checkpoints."""
        return self.out / "state"

    @property
    def run(self) -> Path:
        """ZooKeeper and Kafka data."""
        return self.out / "run"

    @property
    def sink_output(self) -> Path:
        """The output log (and rejects) the sink writes."""
        return self.out / "output"

    @property
    def sink_checkpoint(self) -> Path:
        """Spark's checkpoint."""
        return self.out / "checkpoint"

    def reset(self) -> None:
        """Remove a previous run's data; keep anything else in ``out``."""
        for path in (
            self.ledgers, self.logs, self.state, self.run, self.sink_output, self.sink_checkpoint,
        ):  # fmt: skip
            shutil.rmtree(path, ignore_errors=True)
        for path in (self.ledgers, self.logs, self.state):
            path.mkdir(parents=True, exist_ok=True)


@dataclass
class DemoRun:
    """What happened: timings, fault events, the sink passes; filled while the demo runs."""

    config: DemoConfig
    paths: DemoPaths
    bootstrap: str = ""
    zk_hosts: str = ""
    raw_topic: str = "raw"
    upstream_topic: str = "upstream"
    pids: dict[str, int] = field(default_factory=dict)
    lease_servers: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    fault_events: dict[str, list[str]] = field(default_factory=dict)
    faults_happened: dict[str, bool] = field(default_factory=dict)
    zombie_writes: dict[str, int] = field(default_factory=dict)
    sink_passes: list[dict[str, Any]] = field(default_factory=list)
    roles: list[ProducerRole] = field(default_factory=list)
    copier: CopierCrash | None = None
    copier_workers: list[Worker] = field(default_factory=list)


class _Stopped(Exception):
    """SIGTERM arrived: unwind through the ``finally`` blocks like Ctrl-C does."""


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        raise _Stopped

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: the caller handles signals
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _phase(run: DemoRun, name: str, console: Console) -> Iterator[None]:
    started = time.monotonic()
    console.log(f"[bold]{name}[/bold] …")
    yield
    run.phases[name] = round(time.monotonic() - started, 1)
    console.log(f"{name} done in {run.phases[name]:.1f}s")


def run_demo(
    config: DemoConfig, console: Console | None = None, spark: Any | None = None
) -> dict[str, Any]:
    """Run the demo; return the summary (also written to ``out/summary.json``).

    Args:
        config: what to run.
        console: where progress goes (a fresh rich Console by default).
        spark: a SparkSession to use (left running); by default the demo starts and stops one.

    Returns:
        The summary dict; ``summary["ok"]`` is False on any anomaly.
    """
    from pidfence.services import KafkaCluster, ZooKeeperEnsemble

    console = console or Console()
    paths = DemoPaths(config.out)
    paths.reset()
    run = DemoRun(config, paths)
    started = time.monotonic()
    cleanups: list[Callable[[], None]] = []
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pidfence-demo-spark")
    spark_future: Future[Any] | None = None
    try:
        with _sigterm_unwinds():
            with _phase(run, "services", console):
                if config.zk_hosts:
                    run.zk_hosts = config.zk_hosts
                else:
                    zk = ZooKeeperEnsemble(1, run_dir=paths.run / "zookeeper")
                    cleanups.append(zk.stop)
                    zk.start()
                    run.zk_hosts = zk.hosts
                    run.pids.update({f"zookeeper-{i}": p for i, p in enumerate(zk.pids())})
                if config.bootstrap:
                    run.bootstrap = config.bootstrap
                    suffix = uuid.uuid4().hex[:8]
                    run.raw_topic = f"pidfence-demo-raw-{suffix}"
                    run.upstream_topic = f"pidfence-demo-upstream-{suffix}"
                else:
                    kafka = KafkaCluster(1, run_dir=paths.run / "kafka")
                    cleanups.append(kafka.stop)
                    kafka.start()
                    run.bootstrap = kafka.bootstrap
                    run.pids.update({f"kafka-{i}": p for i, p in enumerate(kafka.pids())})
                for topic in (run.raw_topic, run.upstream_topic):
                    create_topic(run.bootstrap, topic, config.partitions)
                if spark is None:
                    # The Spark JVM starts while producers run; the sink needs it first.
                    spark_future = pool.submit(_spark, config.sink_master, paths.logs / "spark.log")
                else:
                    spark_future = Future[Any]()
                    spark_future.set_result(spark)
                leases = _start_lease_servers(run, cleanups)
                run.lease_servers = ",".join(s.address for s in leases)
            with _phase(run, "produce with faults", console):
                _produce(run, console, cleanups, spark_future)
            with _phase(run, "sink (final pass)", console):
                _sink_pass(run, spark_future.result(), console)
            if spark is None:
                spark_future.result().stop()
            with _phase(run, "check", console):
                from pidfence.demo.summary import collect

                summary = collect(run)
            summary["wall_s"] = round(time.monotonic() - started, 1)
            with _phase(run, "report", console):
                from pidfence.demo.report import write_report

                write_report(summary, paths.out, console)
            if config.keep_running:
                _keep(run, cleanups, console)
            return summary
    finally:
        _cleanup(cleanups, spark_future if spark is None else None, pool, console)


def _spark(master: str, log_file: Path) -> Any:
    from pidfence.services import spark_session

    # The JVM's output (Spark's log at WARN, JVM warnings) goes to out/logs, not the terminal.
    return spark_session(master=master, app_name="pidfence-demo", log_file=log_file)


def _lease_security(run: DemoRun, cleanups: list[Callable[[], None]]) -> list[str]:
    """Auth tokens and TLS for the demo's lease servers, from certificates made now.

    Every pidfence process the demo starts inherits the client side through the environment
    (``PIDFENCE_LEASE_TOKEN_FILE``, ``PIDFENCE_LEASE_TLS_CA``): a token never shows in ``ps``.
    The variables are put back as they were when the demo ends (it may run inside a caller's
    process, e.g. the test suite).
    """
    import os

    from pidfence.pid_allocator.security import TLS_CA_ENV, TOKEN_FILE_ENV
    from pidfence.services.lease_server import make_lease_pki

    pki = make_lease_pki(run.paths.out / "pki")
    before = {name: os.environ.get(name) for name in (TOKEN_FILE_ENV, TLS_CA_ENV)}

    def restore() -> None:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    cleanups.append(restore)
    os.environ[TOKEN_FILE_ENV] = str(pki.token_files["producer"])
    os.environ[TLS_CA_ENV] = str(pki.ca)
    return [
        "--auth-tokens", str(pki.tokens_file),
        "--tls-cert", str(pki.server_cert),
        "--tls-key", str(pki.server_key),
    ]  # fmt: skip


def _start_lease_servers(run: DemoRun, cleanups: list[Callable[[], None]]) -> list[LeaseServerProc]:
    servers = []
    security = _lease_security(run, cleanups)
    for i in range(2):
        server = spawn_lease_server(
            run.zk_hosts,
            run.paths.logs,
            name=f"lease-{i}",
            lifetime=run.config.lifetime,
            security=security,
        )
        cleanups.append(server.stop)
        servers.append(server)
        if server.pid is not None:
            run.pids[f"lease-{i}"] = server.pid
    for server in servers:
        server.wait_listening()
    return servers


def _produce(
    run: DemoRun, console: Console, cleanups: list[Callable[[], None]], spark: Future[Any]
) -> None:
    config, paths = run.config, run.paths
    faults = config.faults
    for i in range(config.producers):
        spec = ProducerSpec(
            name=f"p{i}",
            bootstrap=run.bootstrap,
            lease_servers=run.lease_servers,
            topic=run.raw_topic,
            count=config.records,
            state=paths.state / f"p{i}.json",
            rate=config.rate,
            # Roll over at 3/4 of the lease, not 23/24: the drain before a roll must finish
            # inside the lease, and with the demo's short leases 1/24 (333 ms of an 8 s lease)
            # is less than an acknowledgement can take on a loaded machine (DrainFailed).
            extra=("--lifetime-rollover", "0.75"),
        )
        run.roles.append(ProducerRole(spec, paths.ledgers, paths.logs))
    scripts: list[FaultScript] = []
    assign = iter(run.roles)
    if Fault.KILL in faults:
        scripts.append(KillAndResume(next(assign), at=config.records * 3 // 10))
    if Fault.ZOMBIE in faults:
        lifetime_ms = int(config.lease_lifetime_s * 1000) if Fault.ROLLOVER in faults else 0
        scripts.append(
            Zombie(next(assign), at=config.records * 4 // 10, lease_left_ms=lifetime_ms // 2)
        )
    if Fault.LEASE_ZOMBIE in faults:
        # The producer stops itself right after a state save (nothing in flight), not from
        # outside: records caught in librdkafka's queue by an outside SIGSTOP could land after
        # the lease ended (docs/producer.md, residual windows), which is luck, not a fault.
        role = next(assign)
        at = config.records * 5 // 10
        saves = stop_after(max(1, at // role.spec.checkpoint_every))
        lease_zombie = SelfStoppedLeaseZombie(role, at=at)
        lease_zombie.restore_extra = role.spec.extra  # its replacement runs to the end
        role.spec = replace(role.spec, extra=(*role.spec.extra, *saves))
        scripts.append(lease_zombie)
    if Fault.RESEND in faults:
        role = next(assign)
        role.spec = replace(role.spec, resend_every=max(50, config.records // 20))
    for role in run.roles:
        cleanups.append(role.stop)
        role.spawn()
    if config.copier_records:
        scripts.append(_start_copier(run, cleanups))
    bars = Progress(
        TextColumn("{task.description:>12}"),
        BarColumn(),
        TextColumn("{task.completed:>6,.0f}/{task.total:<6,.0f}"),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    tasks = {
        role.spec.name: bars.add_task(role.spec.name, total=role.spec.count, note="")
        for role in run.roles
    }
    copier_task = (
        bars.add_task("copier", total=config.copier_records, note="")
        if run.copier_workers
        else None
    )
    zombies = [s for s in scripts if isinstance(s, Zombie | LeaseZombie)]
    shown: dict[str, int] = {}
    sink_ran = False

    def update_bars() -> None:
        for role in run.roles:
            wrote = sum(z.zombie_wrote for z in zombies if z.role is role)
            line = role_line(role.instances, zombie_wrote=wrote)
            bars.update(tasks[role.spec.name], completed=line.distinct, note=line.note())
        if copier_task is not None:
            line = role_line(run.copier_workers)
            bars.update(copier_task, completed=line.distinct, note=line.note())

    def tick() -> None:
        nonlocal sink_ran
        update_bars()
        for script in scripts:
            for event in script.events[shown.get(script.name, 0) :]:
                bars.console.log(f"[yellow]fault {script.name}[/yellow]: {event}")
            shown[script.name] = len(script.events)
        # First sink pass mid-run: shows the second pass continuing from the checkpoint.
        if not sink_ran and spark.done() and all(s.done for s in scripts) and _any_running(run):
            sink_ran = True
            bars.stop()
            _sink_pass(run, spark.result(), console)
            bars.start()

    with bars:
        drive(
            scripts,
            timeout=300 + config.produce_seconds * 2,
            tick=tick,
            until=lambda: not _any_running(run),
        )
        update_bars()  # every bar ends in its final state
    for script in scripts:
        run.fault_events[script.name] = script.events
        run.faults_happened[script.name] = script.happened
        if isinstance(script, Zombie | LeaseZombie):
            run.zombie_writes[script.name] = script.zombie_wrote
    # A zombie that stopped itself because it was fenced did what it should.
    failed = [
        w for w in _all_workers(run) if w.exit_code() not in (0, None, -9) and w.fate != "fenced"
    ]
    if failed:
        from pidfence.services.process import ServiceFailed

        first = ", ".join(
            f"{w.name} exited with {w.exit_code()} (log {w.proc.log_path})" for w in failed
        )
        tails = "\n".join(f"--- {w.name}\n{w.tail(15)}" for w in failed)
        raise ServiceFailed(f"a demo process failed: {first}\n{tails}")


def _start_copier(run: DemoRun, cleanups: list[Callable[[], None]]) -> CopierCrash:
    paths = run.paths
    upstream = ProducerRole(
        ProducerSpec(
            name=UPSTREAM_PRODUCER,
            bootstrap=run.bootstrap,
            lease_servers=run.lease_servers,
            topic=run.upstream_topic,
            count=run.config.copier_records,
            state=paths.state / "upstream.json",
            rate=run.config.copier_records / max(5.0, run.config.produce_seconds / 2),
        ),
        paths.ledgers / "upstream",
        paths.logs,
    )
    # The upstream topic's ledger is kept apart: the checker checks the raw topic only.
    upstream.ledger_dir.mkdir(parents=True, exist_ok=True)
    cleanups.append(upstream.stop)
    upstream.spawn()
    run.roles.append(upstream)
    state = paths.state / "copier.json"

    def start() -> Worker:
        n = len(run.copier_workers)
        name = "copier" if n == 0 else f"copier.r{n}"
        argv = copier_argv(
            run.bootstrap,
            run.lease_servers,
            run.upstream_topic,
            run.raw_topic,
            state,
            ledger=paths.ledgers / f"{name}.jsonl",
            idle_exit_s=6.0,
        )
        worker = Worker(name, argv, paths.logs, ledger=paths.ledgers / f"{name}.jsonl").start()
        run.copier_workers.append(worker)
        cleanups.append(worker.stop)
        return worker

    script = CopierCrash(start, state, at=max(1, run.config.copier_records // 3))
    if Fault.COPIER not in run.config.faults:
        script.done = True
    run.copier = script
    return script


def _all_workers(run: DemoRun) -> list[Worker]:
    return [w for role in run.roles for w in role.instances] + run.copier_workers


def _any_running(run: DemoRun) -> bool:
    return any(w.running for w in _all_workers(run))


def _sink_pass(run: DemoRun, spark: Any, console: Console) -> None:
    """One available-now pass of the sink, with ``pidfence sink``'s per-batch lines."""
    import threading

    from pidfence.spark_sink import BatchLine, serve

    started = time.monotonic()
    number = len(run.sink_passes) + 1

    def on_batch(line: BatchLine) -> None:
        console.log(f"sink pass {number}: {line.human()}")

    result = serve(
        spark,
        run.bootstrap,
        run.raw_topic,
        str(run.paths.sink_output),
        str(run.paths.sink_checkpoint),
        on_batch=on_batch,
        stop=threading.Event(),
        available_now=True,
    )
    record: dict[str, Any] = {"pass": number, "seconds": round(time.monotonic() - started, 1)}
    record.update(_as_dict(result))
    run.sink_passes.append(record)
    dropped = sum(result.dropped.values())
    console.log(
        f"sink pass {number} done in {record['seconds']:.1f} s: {len(result.batches)} batch(es), "
        f"{result.records_in:,} in → {result.appended:,} appended, {dropped:,} dropped"
    )


def _as_dict(result: Any) -> dict[str, Any]:
    if hasattr(result, "__dataclass_fields__"):
        from dataclasses import asdict

        return {k: v for k, v in asdict(result).items() if isinstance(v, (int, float, str, dict))}
    return {}


def _keep(run: DemoRun, cleanups: list[Callable[[], None]], console: Console) -> None:
    cleanups.clear()
    state = run.paths.out / "services.json"
    state.write_text(
        json.dumps(
            {
                "zookeeper": run.zk_hosts,
                "kafka": run.bootstrap,
                "lease_servers": run.lease_servers,
                "raw_topic": run.raw_topic,
                "pids": run.pids,
            },
            indent=2,
        )
        + "\n"
    )
    pids = " ".join(str(p) for p in run.pids.values())
    console.print(
        f"[bold]--keep-running[/bold]: ZooKeeper {run.zk_hosts}, Kafka {run.bootstrap}, "
        f"lease servers {run.lease_servers} (details in {state}). Stop them with: kill {pids}"
    )


def _cleanup(
    cleanups: list[Callable[[], None]],
    spark: Future[Any] | None,
    pool: ThreadPoolExecutor,
    console: Console,
) -> None:
    # Ctrl-C during cleanup must not leave processes behind: finish every step first.
    previous = signal.getsignal(signal.SIGINT)
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if spark is not None:
            with contextlib.suppress(Exception):
                spark.result(timeout=120).stop()
        pool.shutdown(wait=True)
        for step in reversed(cleanups):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                console.log(f"[red]cleanup step failed[/red]: {exc}")
    finally:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, previous)
