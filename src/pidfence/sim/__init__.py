"""Deterministic simulation: the real producer and broker rules under a hostile world.

Seeded and in-process: the real ``IdempotentProducer`` (session, driver, sender) over a simulated
Kafka client and lease server; a lossy, duplicating, reordering network; producer crashes resumed
from checkpoints (generation bump + FENCE); zombies; lease server outages; sink restarts
rebuilding state from a snapshot and the Kafka suffix; lease rollover under a fake clock. The
checker judges every run.
``run(seed, **knobs)`` replays a schedule exactly; ``python -m pidfence.sim --seed N`` does too.
"""

from pidfence.sim.knobs import Knobs, Mutation
from pidfence.sim.runner import SimResult, run

__all__ = ["Knobs", "Mutation", "SimResult", "run"]
