"""The demo's producing phase: producers, the copier, the fault plan's scripts, progress bars.

Each step of :attr:`pidfence.demo.config.DemoConfig.plan` becomes a fault script
(:mod:`pidfence.demo.faults`; the network nemesis of :mod:`pidfence.testing`); one loop polls
them all while the bars show each producer's distinct events. Under ``net`` a supervisor restarts
any producer or copier that exits 75 (retriable), as an operator would.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pidfence.demo.config import ROLLOVER_AT, ZOMBIE_LEASE_LEFT, DemoConfig
from pidfence.demo.faults import (
    CopierCrash,
    FaultScript,
    KillAndResume,
    LeaseZombie,
    Zombie,
)
from pidfence.demo.procs import ProducerRole, ProducerSpec, Worker, copier_argv
from pidfence.demo.progress import role_line
from pidfence.demo.record import DemoPaths, Endpoints, FaultOutcome, Produced
from pidfence.demo.soak.faults import SelfStoppedLeaseZombie, stop_after
from pidfence.services.process import ServiceFailed
from pidfence.testing.nemesis import NetworkNemesis
from pidfence.testing.network import LinkFaults
from pidfence.testing.plan import FaultKind, FaultPlan, Link
from pidfence.testing.script import drive
from pidfence.testing.supervise import Supervisor

UPSTREAM_PRODUCER = "upstream"
Cleanups = list[Callable[[], None]]

#: The copier's ``--idle-exit`` when nothing can hold the upstream records back from it: it ends
#: this long after the last one, well before the producers (upstream runs half their time).
COPIER_IDLE_EXIT_S = 6.0
#: librdkafka's default ``reconnect.backoff.max.ms``: after a link heals, a client may wait this
#: long before it connects again.
RECONNECT_BACKOFF_MAX_S = 10.0
#: The links a toxic on which can keep upstream records from the copier: the upstream producer
#: and the copier reach Kafka and the lease servers through them (the sink's link cannot).
COPIER_LINKS = frozenset({Link.PRODUCER_KAFKA, Link.PRODUCER_LEASE, Link.LEASE_ZOOKEEPER})


def produce(
    config: DemoConfig,
    paths: DemoPaths,
    ends: Endpoints,
    links: LinkFaults | None,
    cleanups: Cleanups,
    console: Console,
    mid_run: Callable[[], bool],
) -> Produced:
    """Run producers and the copier under the plan's faults until every process ended.

    Args:
        mid_run: called on each tick once every fault is done while processes still run; it
            returns True once it did its work (the demo's first sink pass).
    """
    plan = config.plan
    roles = [_role(config, paths, ends, i) for i in range(config.producers)]
    by_name = {role.spec.name: role for role in roles}
    scripts: list[FaultScript] = []
    for fault in plan:
        role = by_name.get(fault.target)
        at = int(config.records * fault.at_acked)
        if role is None:
            continue
        if fault.kind is FaultKind.KILL:
            scripts.append(KillAndResume(role, at=at))
        elif fault.kind is FaultKind.ZOMBIE:
            lifetime_ms = config.lease_lifetime_s * 1000
            left = int(lifetime_ms * ZOMBIE_LEASE_LEFT) if config.short_leases else 0
            scripts.append(Zombie(role, at=at, lease_left_ms=left))
        elif fault.kind is FaultKind.LEASE_ZOMBIE:
            # The producer stops itself right after a state save (nothing in flight), not from
            # outside: records caught in librdkafka's queue by an outside SIGSTOP could land
            # after the lease ended (docs/producer.md, residual windows): luck, not a fault.
            saves = stop_after(max(1, at // role.spec.checkpoint_every))
            lease_zombie = SelfStoppedLeaseZombie(role, at=at)
            lease_zombie.restore_extra = role.spec.extra  # its replacement runs to the end
            role.spec = replace(role.spec, extra=(*role.spec.extra, *saves))
            scripts.append(lease_zombie)
        elif fault.kind is FaultKind.RESEND:
            role.spec = replace(role.spec, resend_every=max(50, config.records // 20))
    for role in roles:
        cleanups.append(role.stop)
        role.spawn()
    copier: CopierCrash | None = None
    unarmed: list[FaultScript] = []  # scripts of faults not asked for: nothing to report
    if config.copier_records:
        roles.append(_start_upstream(config, paths, ends, cleanups))
        armed = any(f.target == "copier" for f in plan.of_kind(FaultKind.KILL))
        copier = _copier(config, paths, ends, cleanups, armed)
        scripts.append(copier)
        if not armed:
            unarmed.append(copier)
    copiers: Sequence[Worker] = copier.instances if copier is not None else ()
    supervisors: list[Supervisor] = []
    if links is not None:
        scripts.append(NetworkNemesis(plan, links))
        supervisors = [_role_supervisor(role) for role in roles]
        if copier is not None:
            supervisors.append(_copier_supervisor(copier))
    _drive(config, roles, copiers, scripts, supervisors, console, mid_run)
    workers = [w for role in roles for w in role.instances]
    retried = {name for s in supervisors for name, code in s.exits if code == 75}
    failed = [w for w in [*workers, *copiers] if not ended_as_planned(w, retried)]
    crashed = [w for w in failed if crashed_on_its_own(w)]
    if broken := [w for w in failed if w not in crashed]:
        first = ", ".join(
            f"{w.name} exited with {w.exit_code()} (log {w.proc.log_path})" for w in broken
        )
        tails = "\n".join(f"--- {w.name}\n{w.tail(15)}" for w in broken)
        raise ServiceFailed(f"a demo process failed: {first}\n{tails}")
    for s in supervisors:
        for name, code in s.exits:
            if code == 75:
                s.note(f"{name} exited 75 (retriable) and was restarted")
    resend = next((r for r in roles if r.spec.resend_every), None)
    happened = {s.name: s.happened for s in scripts if s not in unarmed}
    if resend is not None:
        # No script: the resend happened when the producer got records acknowledged twice.
        happened["resend"] = resend.acked() > resend.distinct()
    outcome = FaultOutcome(
        events={s.name: tuple(s.events) for s in scripts if s not in unarmed}
        | {f"supervisor {s.name}": tuple(s.events) for s in supervisors if s.events},
        happened=happened,
        zombie_writes={
            s.name: s.zombie_wrote for s in scripts if isinstance(s, Zombie | LeaseZombie)
        },
        plan=tuple(plan.describe()),
        seed=plan.seed if links is not None else None,
        crashed=tuple(
            f"{w.name} exited with {w.exit_code()} (log {w.proc.log_path})" for w in crashed
        ),
    )
    return Produced(tuple(workers), tuple(copiers), outcome)


#: The fates a fault script gives the instances it ends: a SIGKILL (exit -9) is theirs.
KILLED_BY_THE_DEMO = frozenset({"killed", "replaced", "fenced"})


def ended_as_planned(worker: Worker, retried: Collection[str] = ()) -> bool:
    """Whether ``worker`` ended as the run meant it to: exit 0; killed (-9) by a fault script
    (its fate says so); a zombie that stopped itself fenced; or (``net``) exited 75 and was
    restarted by a supervisor. A -9 the demo did not send is someone else's."""
    code = worker.exit_code()
    if code in (0, None) or worker.fate == "fenced" or worker.name in retried:
        return True
    return code == -9 and worker.fate in KILLED_BY_THE_DEMO


def crashed_on_its_own(worker: Worker) -> bool:
    """Whether a failed ``worker`` crashed (an uncaught error: exit 1, a traceback in its log):
    a pidfence bug the report counts as an anomaly, unlike a service it could not reach."""
    return worker.exit_code() == 1 or "Traceback (most recent call last)" in worker.tail(50)


def _role(config: DemoConfig, paths: DemoPaths, ends: Endpoints, i: int) -> ProducerRole:
    spec = ProducerSpec(
        name=f"p{i}",
        bootstrap=ends.producer_bootstrap,
        lease_servers=ends.lease_servers,
        topic=ends.raw_topic,
        count=config.records,
        state=paths.state / f"p{i}.json",
        rate=config.rate,
        # Roll over at 3/4 of the lease, not 23/24 (config.ROLLOVER_AT says why).
        extra=("--lifetime-rollover", f"{ROLLOVER_AT:g}"),
    )
    return ProducerRole(spec, paths.ledgers, paths.logs)


def _role_supervisor(role: ProducerRole) -> Supervisor:
    def current() -> Worker:
        return role.current

    return Supervisor(role.spec.name, current, role.spawn)


def _copier_supervisor(copier: CopierCrash) -> Supervisor:
    def current() -> Worker:
        return copier.instances[-1]

    def restart() -> None:
        copier.instances.append(copier.start())

    return Supervisor("copier", current, restart)


def _drive(
    config: DemoConfig,
    roles: list[ProducerRole],
    copiers: Sequence[Worker],
    scripts: list[FaultScript],
    supervisors: list[Supervisor],
    console: Console,
    mid_run: Callable[[], bool],
) -> None:
    bars = Progress(
        TextColumn("{task.description:>12}"),
        BarColumn(),
        TextColumn("{task.completed:>6,.0f}/{task.total:<6,.0f}"),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    tasks = {r.spec.name: bars.add_task(r.spec.name, total=r.spec.count, note="") for r in roles}
    copier_task = bars.add_task("copier", total=config.copier_records, note="") if copiers else None
    zombies = [s for s in scripts if isinstance(s, Zombie | LeaseZombie)]
    shown: dict[int, int] = {}
    sink_ran = False

    def running() -> bool:
        return any(w.running for w in [*(w for r in roles for w in r.instances), *copiers])

    def update_bars() -> None:
        for role in roles:
            wrote = sum(z.zombie_wrote for z in zombies if z.role is role)
            line = role_line(role.instances, zombie_wrote=wrote)
            bars.update(tasks[role.spec.name], completed=line.distinct, note=line.note())
        if copier_task is not None:
            line = role_line(list(copiers))
            bars.update(copier_task, completed=line.distinct, note=line.note())

    def tick() -> None:
        nonlocal sink_ran
        for supervisor in supervisors:
            supervisor.poll()
        update_bars()
        for script in [*scripts, *supervisors]:
            for event in script.events[shown.get(id(script), 0) :]:
                bars.console.log(f"[yellow]fault {script.name}[/yellow]: {event}")
            shown[id(script)] = len(script.events)
        # First sink pass mid-run: shows the second pass continuing from the checkpoint.
        if not sink_ran and all(s.done for s in scripts) and running():
            bars.stop()
            sink_ran = mid_run()
            bars.start()

    with bars:
        try:
            drive(
                scripts,
                timeout=300 + config.produce_seconds * 2,
                tick=tick,
                until=lambda: not running() and not any(s.pending for s in supervisors),
            )
        finally:
            for script in scripts:
                if isinstance(script, NetworkNemesis):
                    script.heal()
        update_bars()  # every bar ends in its final state


def _start_upstream(
    config: DemoConfig, paths: DemoPaths, ends: Endpoints, cleanups: Cleanups
) -> ProducerRole:
    upstream = ProducerRole(
        ProducerSpec(
            name=UPSTREAM_PRODUCER,
            bootstrap=ends.producer_bootstrap,
            lease_servers=ends.lease_servers,
            topic=ends.upstream_topic,
            count=config.copier_records,
            state=paths.state / "upstream.json",
            rate=config.copier_records / max(5.0, config.produce_seconds / 2),
        ),
        paths.ledgers / "upstream",
        paths.logs,
    )
    # The upstream topic's ledger is kept apart: the checker checks the raw topic only.
    upstream.ledger_dir.mkdir(parents=True, exist_ok=True)
    cleanups.append(upstream.stop)
    upstream.spawn()
    return upstream


def _copier(
    config: DemoConfig, paths: DemoPaths, ends: Endpoints, cleanups: Cleanups, armed: bool
) -> CopierCrash:
    state = paths.state / "copier.json"
    copies = (ends.producer_bootstrap, ends.lease_servers, ends.upstream_topic, ends.raw_topic)
    idle_exit = copier_idle_exit_s(config.plan)
    started = 0

    def start() -> Worker:
        nonlocal started
        name = "copier" if not started else f"copier.r{started}"
        started += 1
        ledger = paths.ledgers / f"{name}.jsonl"
        argv = copier_argv(*copies, state=state, ledger=ledger, idle_exit=idle_exit)
        worker = Worker(name, argv, paths.logs, ledger=ledger).start()
        cleanups.append(worker.stop)
        return worker

    script = CopierCrash(start, state, at=max(1, config.copier_records // 3))
    if not armed:
        script.done = True
    return script


def copier_idle_exit_s(plan: FaultPlan) -> float:
    """The demo copier's ``--idle-exit``: :data:`COPIER_IDLE_EXIT_S` past the longest silence the
    plan's toxics on :data:`COPIER_LINKS` can cause.

    A copier that idles out while upstream still sends misses records (``copier_missing``). A
    silence lasts from a toxic's start until its link heals and the clients have reconnected
    (:data:`RECONNECT_BACKOFF_MAX_S`); toxics closer together than that make one silence.
    """
    spans = sorted((s.at_s, s.ends_s) for s in plan.network_steps if s.target in COPIER_LINKS)
    if not spans:
        return COPIER_IDLE_EXIT_S
    longest = 0.0
    start, end = spans[0]
    for at, ends in spans:
        if at > end + RECONNECT_BACKOFF_MAX_S:
            start, end = at, ends
        end = max(end, ends)
        longest = max(longest, end - start)
    return COPIER_IDLE_EXIT_S + longest + RECONNECT_BACKOFF_MAX_S
