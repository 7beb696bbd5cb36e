"""The soak run: the demo's pipeline for a long time, faults repeated, samples, the checker.

Producers (``pidfence produce``, rate-limited, leases rolling over) write the raw topic; a
pidfence streaming query (processing-time trigger, its own Spark driver process) reads it. Every
``fault_every_s`` one round of the demo's producer faults runs (SIGKILL + resume, zombie pause and
wake, a zombie that outlives its lease; one producer re-sends acknowledged records throughout);
halfway between rounds the sink is restarted, alternately with SIGTERM and by a crash. Every
``sample_s`` the RSS of every process tree started here, the sink's batch times (from the query
progress), the bytes under the output's ``_state`` and the record counts are sampled into
``samples.jsonl``. At the end the producers stop, one available-now pass drains the topic and
:func:`pidfence.verify.check` compares every ledger with the output log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pidfence.demo.faults import FaultScript, LeaseZombie, Zombie
from pidfence.demo.procs import ProducerRole, ProducerSpec
from pidfence.demo.soak.config import OUT_ENV, SoakConfig
from pidfence.demo.soak.faults import (
    SelfStoppedLeaseZombie,
    SinkProc,
    SinkRestart,
    SoakKill,
    SoakZombie,
    adopt_replacement,
    soak_sink_argv,
    stop_after,
)
from pidfence.demo.soak.result import SoakResult, SoakServices
from pidfence.demo.soak.sample import take_sample
from pidfence.demo.start import two_lease_servers
from pidfence.services.lease_server import LeaseServerProcess
from pidfence.services.process import ServiceFailed

if TYPE_CHECKING:
    from pidfence.services import KafkaCluster, ZooKeeperEnsemble

_Cluster = TypeVar("_Cluster", "ZooKeeperEnsemble", "KafkaCluster")

#: Producer roles by the fault each one gets, in order.
ROLES = ("kill", "zombie", "lease-zombie", "resend")


#: The file that marks a folder as a soak's (a reused one is reset, another is refused).
MARKER = ".pidfence-soak"

#: How a producer may end after the soak's final SIGINT: it had sent its count (0), it flushed
#: and stopped (130: the CLI's exit on Ctrl-C), or the signal came before the interpreter had its
#: handler (it had sent nothing).
STOPPED_BY_SIGINT = frozenset({0, 130, -signal.SIGINT})

#: The anomalies of a run that had nothing to judge: the checker finds none in empty inputs.
HOLLOW = ("nothing_acknowledged", "nothing_appended")


def hollow_run(acknowledged: int, appended: int, ledgers: Path, output: Path) -> dict[str, str]:
    """Why the checker's verdict means nothing: no data record acknowledged (the ledgers under
    ``ledgers`` hold none) or none appended (``output``'s log is empty), as anomaly name to
    reason; empty when there was something to check."""
    found = {}
    if acknowledged == 0:
        found["nothing_acknowledged"] = (
            f"no producer got a record acknowledged: the ledgers under {ledgers} hold none"
        )
    if appended == 0:
        found["nothing_appended"] = f"the sink appended no record: the log at {output} is empty"
    return found


def unexpected_stops(exits: Iterable[tuple[str, int | None]]) -> list[str]:
    """The producers, by name and exit code, that did not end as the final SIGINT asks
    (:data:`STOPPED_BY_SIGINT`), each as one failure line."""
    expected = ", ".join(str(c) for c in sorted(STOPPED_BY_SIGINT))
    return [
        f"{name} exited with {code} after the final SIGINT (expected one of {expected})"
        for name, code in exits
        if code not in STOPPED_BY_SIGINT
    ]


class SoakRun:
    """One soak: :meth:`run` starts everything, drives it, checks, and stops it all by pid.

    Args:
        config: what to run.
        log: where one-line progress goes (``print`` by default).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        config: SoakConfig,
        log: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.log = log
        self.clock = clock
        out = config.out
        self.ledgers, self.logs, self.state = out / "ledgers", out / "logs", out / "state"
        self.output, self.checkpoint = out / "output", out / "checkpoint"
        self.result = SoakResult(config={k: str(v) for k, v in vars(config).items()})
        self.roles: list[ProducerRole] = []
        self.scripts: list[FaultScript] = []
        self.sink: SinkProc | None = None
        self.lease_servers: list[LeaseServerProcess] = []
        self._cleanups: list[Callable[[], None]] = []
        self._started = 0.0
        self._wall_started = 0.0
        self.topic = ""

    # ---- the run ---------------------------------------------------------------------------

    def _fresh_out(self) -> None:
        """Remove a previous soak's files from ``out``; refuse a folder that is not a soak's.

        Raises:
            ServiceFailed: ``out`` holds folders the soak would delete, and no soak's files.
        """
        out = self.config.out
        folders = (self.ledgers, self.logs, self.state, self.output, self.checkpoint, out / "run")
        found = [p.name for p in folders if p.exists()]
        if found and not (out / MARKER).exists():
            raise ServiceFailed(
                f"{OUT_ENV}={out} holds {', '.join(found)} but no {MARKER}: not a soak's folder, "
                "and the soak would delete them; choose another folder"
            )
        for path in folders:
            shutil.rmtree(path, ignore_errors=True)
        for name in ("batches.jsonl", "samples.jsonl", "soak.json"):
            (out / name).unlink(missing_ok=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text("a pidfence soak's folder: the next soak here resets it\n")

    def run(self) -> SoakResult:
        """Run the soak to the end; every process started here is stopped in ``finally``.

        A reused ``PIDFENCE_SOAK_OUT`` loses the previous run's files first: its ledgers and
        batch log would be judged with this run's (another topic: every event "lost")."""
        self._fresh_out()
        for path in (self.ledgers, self.logs, self.state):
            path.mkdir(parents=True, exist_ok=True)
        try:
            with self._phase("services"):
                services = self._services()
            with self._phase("soak"):
                self._soak(services)
            with self._phase("drain"):
                self._drain(services)
            with self._phase("check"):
                self._check()
        finally:
            for step in reversed(self._cleanups):
                try:
                    step()
                except Exception as exc:  # noqa: BLE001 - keep stopping the others
                    self.log(f"cleanup step failed: {exc}")
        self.result.batches = self.sink.lines if self.sink is not None else []
        (self.config.out / "soak.json").write_text(
            json.dumps(self.result.as_dict(), indent=1, default=str) + "\n"
        )
        return self.result

    @contextlib.contextmanager
    def _phase(self, name: str) -> Any:
        started = self.clock()
        self.log(f"{name} …")
        yield
        self.result.phases_s[name] = round(self.clock() - started, 1)
        self.log(f"{name} done in {self.result.phases_s[name]:.1f} s")

    def _services(self) -> SoakServices:
        from pidfence.demo.topic import create_raw_topic
        from pidfence.services import KafkaCluster, ZooKeeperEnsemble

        config = self.config
        trees: dict[str, list[int]] = {}

        def own(name: str, cluster: _Cluster) -> _Cluster:
            self._cleanups.append(cluster.stop)  # before start: a failed start is stopped too
            cluster.start()
            trees[name] = cluster.pids()
            return cluster

        run = config.out / "run"
        zk_hosts = (
            config.zk_hosts
            or own("zookeeper", ZooKeeperEnsemble(1, run_dir=run / "zookeeper")).hosts
        )
        bootstrap = (
            config.bootstrap or own("kafka", KafkaCluster(1, run_dir=run / "kafka")).bootstrap
        )
        self.topic = f"soak-raw-{os.getpid()}-{int(time.time())}"
        create_raw_topic(bootstrap, self.topic, config.partitions)
        lifetime_ms = round(config.lease_lifetime_s * 1000)
        self.lease_servers += two_lease_servers(zk_hosts, self.logs, self._cleanups, lifetime_ms)
        return SoakServices(bootstrap, zk_hosts, trees)

    def _soak(self, services: SoakServices) -> None:
        config = self.config
        lease = ",".join(s.address for s in self.lease_servers)
        # Enough records for the whole run and its stalls; the producers are stopped at the end.
        count = int(config.rate * (config.seconds + 3600))
        for i in range(config.producers):
            spec = ProducerSpec(
                name=f"p{i}",
                bootstrap=services.bootstrap,
                lease_servers=lease,
                topic=self.topic,
                count=count,
                state=self.state / f"p{i}.json",
                rate=config.rate,
            )
            if i < len(ROLES) and ROLES[i] == "resend":
                spec = replace(spec, resend_every=config.resend_every)
            if i < len(ROLES) and ROLES[i] == "lease-zombie":
                spec = replace(spec, extra=stop_after(self._saves(config.first_fault_s)))
            role = ProducerRole(spec, self.ledgers, self.logs)
            self.roles.append(role)
            self._cleanups.append(role.stop)
        self.sink = SinkProc(
            soak_sink_argv(
                services.bootstrap,
                self.topic,
                self.output,
                self.checkpoint,
                self.config.out / "batches.jsonl",
                self.logs,
                trigger_s=config.trigger_s,
                lifetime=config.lifetime,
                master=config.master,
            ),
            self.config.out / "batches.jsonl",
            self.logs,
        )
        self._cleanups.append(self._crash_sink)
        self.sink.start()
        for role in self.roles:
            role.spawn()
            if role.spec.extra:
                # Replacements stop themselves one fault period after they start.
                role.spec = replace(role.spec, extra=stop_after(self._saves(config.fault_every_s)))
        self._started = self.clock()
        self._wall_started = self.result.wall_started = time.time()
        self.log(
            f"producing for {config.minutes:g} min: {config.producers} producers at "
            f"{config.rate:g}/s into {self.topic}, sink trigger {config.trigger_s:g} s"
        )
        self._drive(services)
        self._stop_producers()
        self._sample(services)

    def _saves(self, seconds: float) -> int:
        """State saves a producer makes in ``seconds``: one at start, one per checkpoint."""
        per_save = ProducerSpec.checkpoint_every / self.config.rate
        return 1 + int(seconds / per_save)

    def _crash_sink(self) -> None:
        if self.sink is not None:
            self.sink.crash()

    def _drive(self, services: SoakServices) -> None:
        config = self.config
        end = self._started + config.seconds
        # No fault round starts within one lease lifetime (plus slack) of the end.
        last_start = end - config.lease_lifetime_s - 15.0
        next_round = self._started + config.first_fault_s
        next_sink = next_round + config.fault_every_s / 2
        next_sample = self._started
        active: dict[str, FaultScript] = {}
        shown: dict[str, int] = {}
        rounds = sink_restarts = 0
        deadline = end + 300.0
        while True:
            now = self.clock()
            for key, script in list(active.items()):
                script.poll()
                for text in script.events[shown.get(key, 0) :]:
                    self._event(script.name, text)
                shown[key] = len(script.events)
                if script.done:
                    self._finish(key, script)
                    del active[key]
            if now >= next_round and now <= last_start:
                rounds += 1
                for i, role in enumerate(self.roles[: len(ROLES)]):
                    key = f"p{i}"
                    fault = None if key in active else self._fault_for(ROLES[i], role)
                    if fault is not None:
                        active[key] = fault
                        shown[key] = 0
                        self._event(fault.name, f"round {rounds} on {role.current.name}")
                next_round += config.fault_every_s
            restart_due = config.sink_restarts and now >= next_sink and now <= last_start
            if restart_due and "sink" not in active and self.sink:
                active["sink"] = SinkRestart(self.sink, crash=sink_restarts % 2 == 1)
                shown["sink"] = 0
                sink_restarts += 1
                self._event(active["sink"].name, f"round {sink_restarts} on {self.sink.label}")
                next_sink += config.fault_every_s
            self._supervise(active)
            if now >= next_sample:
                self._sample(services)
                next_sample += config.sample_s
            if now >= end and not active:
                return
            if now > deadline:
                raise ServiceFailed(f"soak faults not finished 300 s after the end: {list(active)}")
            time.sleep(0.25)

    def _fault_for(self, kind: str, role: ProducerRole) -> FaultScript | None:
        at = role.acked() + int(self.config.rate * 2)
        if kind == "kill":
            return SoakKill(role, at=at)
        if kind == "zombie":
            lease_left_ms = int(self.config.lease_lifetime_s * 1000) // 2
            return SoakZombie(role, at=at, lease_left_ms=lease_left_ms)
        if kind == "lease-zombie":
            return SelfStoppedLeaseZombie(role, at=at)
        return None

    def _finish(self, key: str, script: FaultScript) -> None:
        if script.happened:
            self.result.faults_happened[script.name] += 1
        if isinstance(script, Zombie | LeaseZombie):
            adopt_replacement(self.roles[int(key[1:])], script.replacement)

    def _event(self, name: str, text: str) -> None:
        t = round(self.clock() - self._started, 1)
        self.result.faults.append({"t_s": t, "fault": name, "event": text})
        self.log(f"[{t:7.1f} s] {name}: {text}")

    def _supervise(self, active: dict[str, FaultScript]) -> None:
        """Restart what died on its own (and record it: a soak must not have any)."""
        for i, role in enumerate(self.roles):
            if f"p{i}" in active or role.running():
                continue
            worker = role.current
            self.result.failures.append(
                f"{worker.name} exited with {worker.exit_code()} (log {worker.proc.log_path})"
            )
            if sum(f.startswith(f"{role.spec.name}") for f in self.result.failures) > 3:
                raise ServiceFailed(
                    f"{role.spec.name} keeps failing: {self.result.failures[-1]}\n{worker.tail(15)}"
                )
            self._event("failure", f"{worker.name} exited with {worker.exit_code()}; restarted")
            role.spawn()
        sink = self.sink
        if sink is not None and "sink" not in active and not sink.running:
            self.result.failures.append(f"{sink.label} exited with {sink.exit_code()}")
            self._event("failure", f"{sink.label} exited with {sink.exit_code()}; restarted")
            sink.start()

    def _stop_producers(self) -> None:
        """SIGINT every running producer (it closes its producer, flushing), then wait."""
        running = [w for role in self.roles for w in role.instances if w.running]
        for worker in running:
            if worker.pid is not None:
                # A producer may have stopped itself (--stop-after-checkpoint) with no round left.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGCONT)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGINT)
        deadline = self.clock() + 60.0
        while any(w.running for w in running) and self.clock() < deadline:
            time.sleep(0.5)
        ignored = [w for w in running if w.running]
        for worker in ignored:
            self.result.failures.append(f"{worker.name} ignored SIGINT for 60 s")
            worker.stop()
        exits = [
            (f"{w.name} (log {w.proc.log_path})", w.exit_code())
            for w in running
            if w not in ignored
        ]
        for failure in unexpected_stops(exits):
            self.result.failures.append(failure)
            self._event("failure", failure)
        self._event("end", f"stopped {len(running)} producer(s)")

    # ---- sampling --------------------------------------------------------------------------

    def _sample(self, services: SoakServices) -> None:
        if self.sink is not None:
            self.sink.read()
        t = round(self.clock() - self._started, 1)
        since = self.result.samples[-1]["t_s"] if self.result.samples else -1.0
        sample = take_sample(
            services.trees,
            self.lease_servers,
            self.roles,
            self.sink,
            self.output,
            since_s=since,
            t_s=t,
            wall_started=self._wall_started,
        )
        self.result.samples.append(sample)
        with (self.config.out / "samples.jsonl").open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(sample) + "\n")
        total = sum(sample["rss"].values()) / 2**20
        self.log(
            f"[{t:7.1f} s] sample: RSS {total:,.0f} MB in all, state "
            f"{sample['state_bytes'] / 1024:,.0f} KB, {sample['pidfence_files']} files under "
            f"_pidfence/, {sample['batches']} batches, median batch "
            f"{sample['batch_s_median']} s, {sample['records_in']:,} in → "
            f"{sample['appended']:,} appended"
        )

    # ---- the end ---------------------------------------------------------------------------

    def _drain(self, services: SoakServices) -> None:
        """Stop the streaming query, then one available-now pass reads what is left."""
        del services
        sink = self.sink
        if sink is None:
            return
        sink.stop()
        self._event("end", f"{sink.label} stopped (exit {sink.exit_code()})")
        sink.start(available_now=True)
        code = sink.wait(timeout=900.0)
        sink.read()
        if code != 0:
            raise ServiceFailed(f"the final available-now pass {sink.label} exited with {code}")
        self._event("end", f"{sink.label} drained the topic")

    def _check(self) -> None:
        from pidfence.demo.summary import (
            anomaly_counts,
            anomaly_examples,
            informational_counts,
            ledger_entries,
        )
        from pidfence.spark_sink import read_log, read_rejects
        from pidfence.verify.check import check

        ledgers = ledger_entries(self.ledgers)
        everything = [e for entries in ledgers.values() for e in entries]
        log = read_log(str(self.output))
        rejects = read_rejects(str(self.output))
        report = check(everything, log, rejects)
        data = [e for e in everything if not e.fence]
        # Empty ledgers against an empty log agree: the check alone would pass a run that did
        # nothing (the demo's checker refuses an empty ledger folder for the same reason).
        hollow = hollow_run(len(data), log.num_rows, self.ledgers, self.output)
        self.result.anomalies = anomaly_counts(report) | {k: int(k in hollow) for k in HOLLOW}
        self.result.informational = informational_counts(report)
        self.result.examples = anomaly_examples(report) | {k: [v] for k, v in hollow.items()}
        self.result.counts = {
            "sent_acknowledged": len(data),
            "fences_acknowledged": len(everything) - len(data),
            "appended": log.num_rows,
            "rejected": rejects.num_rows,
            "pids_used": len({e.pid for e in everything}),
            "producer_instances": sum(len(r.instances) for r in self.roles),
            "sink_instances": self.sink.started if self.sink else 0,
        }
        verdicts = Counter(str(v) for v in rejects.column("verdict").to_pylist())
        self.result.verdicts = {"APPENDED": log.num_rows, **dict(sorted(verdicts.items()))}
        self.log(f"check: anomalies {self.result.anomalies}, verdicts {self.result.verdicts}")


def run_soak(config: SoakConfig, log: Callable[[str], None] = print) -> SoakResult:
    """Run one soak (see the module docstring); the result is also in ``out/soak.json``."""
    return SoakRun(config, log).run()
