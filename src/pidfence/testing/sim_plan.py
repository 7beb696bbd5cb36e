"""A fault plan in the simulation's terms: :class:`pidfence.sim.knobs.Knobs` keyword arguments.

The simulation swaps the network, Kafka, the lease server and time for seeded models, so a plan's
steps map onto the probabilities it already has where they mean the same thing:

==========================================  ==========================================
plan step                                   knob
==========================================  ==========================================
producer ``kill``                           ``crash_p`` (crash, resume from checkpoint)
producer ``zombie``                         ``crash_p`` + ``zombie_p``
producer ``pause`` / ``lease-zombie``       ``crash_p`` + ``zombie_p`` + ``pause_p``
``resend``; ``one-way-loss`` to Kafka       ``dup_p`` (written, acknowledgement lost)
``blackhole`` / ``reset`` to Kafka          ``drop_p`` (lost on the way, retried)
``latency`` (jitter) / ``slice`` to Kafka   ``reorder`` 3
faults on the lease server or its links     ``down_p`` (a crashed chain restarts late)
sink ``kill`` / ``restart`` / crash points  ``restart_p`` (rebuild from a snapshot)
sink to Kafka cut (blackhole, reset, loss)  ``restart_p`` (the query fails, restarts)
``rollover``                                short ``lifetime_ms`` (the default, 2400)
==========================================  ==========================================

What the simulation does not model (bandwidth limits, slow links to the sink, ZooKeeper and Kafka
processes as such) is listed by :func:`unmapped`.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from pidfence.testing.plan import FaultKind, FaultPlan, FaultStep, Link

#: The probability a knob gets when the plan has a step that maps onto it.
P_ON = {
    "crash_p": 0.03,
    "zombie_p": 0.5,
    "pause_p": 0.3,
    "dup_p": 0.1,
    "drop_p": 0.1,
    "down_p": 0.1,
    "restart_p": 0.1,
}
_PRODUCERS = ("p", "producer", "copier", "upstream")
_LEASE = ("lease", "zookeeper", Link.PRODUCER_LEASE.value, Link.LEASE_ZOOKEEPER.value)


def _is_producer(target: str) -> bool:
    return target.startswith(_PRODUCERS)


def _knobs_of(fault: FaultStep) -> dict[str, Any]:
    kind, target = fault.kind, fault.target
    if target in _LEASE and kind is not FaultKind.ROLLOVER:
        return {"down_p": P_ON["down_p"]}
    if target == "sink" or kind is FaultKind.SINK_CRASH:
        return {"restart_p": P_ON["restart_p"]}
    if target == Link.SINK_KAFKA.value:
        cut = kind in (FaultKind.BLACKHOLE, FaultKind.RESET, FaultKind.ONE_WAY_LOSS)
        return {"restart_p": P_ON["restart_p"]} if cut else {}
    if kind is FaultKind.ROLLOVER:
        return {"lifetime_ms": 2400}
    if kind is FaultKind.RESEND:
        return {"dup_p": P_ON["dup_p"]}
    if target == Link.PRODUCER_KAFKA.value:
        if kind is FaultKind.ONE_WAY_LOSS:
            return {"dup_p": P_ON["dup_p"]}
        if kind in (FaultKind.BLACKHOLE, FaultKind.RESET):
            return {"drop_p": P_ON["drop_p"]}
        if kind is FaultKind.SLICE or (
            kind is FaultKind.LATENCY and int(fault.param("jitter_ms", 0)) > 0
        ):
            return {"reorder": 3}
        return {}
    if not _is_producer(target):
        return {}
    crash = {"crash_p": P_ON["crash_p"]}
    if kind is FaultKind.KILL:
        return crash
    if kind is FaultKind.ZOMBIE:
        return {**crash, "zombie_p": P_ON["zombie_p"]}
    if kind in (FaultKind.PAUSE, FaultKind.LEASE_ZOMBIE):
        return {**crash, "zombie_p": P_ON["zombie_p"], "pause_p": P_ON["pause_p"]}
    return {}


def sim_knobs(plan: FaultPlan) -> dict[str, Any]:
    """Keyword arguments of :class:`pidfence.sim.knobs.Knobs` for what ``plan`` does.

    Every fault probability the plan does not ask for is 0 (the simulation then injects only the
    plan's kinds); knobs the installed simulation does not have are left out.
    """
    from pidfence.sim.knobs import Knobs

    known = {f.name for f in fields(Knobs)}
    knobs: dict[str, Any] = {name: 0.0 for name in P_ON}
    knobs["reorder"] = 1
    for fault in plan:
        for name, value in _knobs_of(fault).items():
            knobs[name] = max(knobs.get(name, 0), value) if name != "lifetime_ms" else value
    return {k: v for k, v in knobs.items() if k in known}


def unmapped(plan: FaultPlan) -> list[FaultStep]:
    """The steps of ``plan`` the simulation has no model for."""
    return [fault for fault in plan if not _knobs_of(fault)]
