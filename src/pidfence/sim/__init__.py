"""Deterministic simulation: the real ``Sequencer`` and broker rules under a hostile world.

Seeded and in-process: a lossy, duplicating, reordering network; producer crashes resumed from
checkpoints (generation bump + FENCE); zombies; sink restarts rebuilding state from a snapshot and
the Kafka suffix; lease rollover under a fake clock. The checker judges every run.
``run(seed, **knobs)`` replays a schedule exactly; ``python -m pidfence.sim --seed N`` does too.
"""

from pidfence.sim.knobs import Knobs, Mutation
from pidfence.sim.runner import SimResult, run

__all__ = ["Knobs", "Mutation", "SimResult", "run"]
