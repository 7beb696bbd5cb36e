"""Deterministic simulation: the real producer, lease service and sink path under a hostile world.

Seeded and in-process: the real ``IdempotentProducer`` (session, driver, sender) over a simulated
Kafka client and lease server; a lossy, duplicating, reordering network; producer crashes resumed
from checkpoints (generation bump + FENCE); zombies; lease server outages; the sink's batches
decided through the real sink's batch path; sink restarts rebuilding state as the real sink does
(an older state file, then the committed batches after it replayed from their decisions); lease
rollover under a fake clock. The checker and the oracle judge every run.
``run(seed, **knobs)`` replays a schedule exactly; ``python -m pidfence.sim --seed N`` does too.
"""

from pidfence.sim.knobs import Knobs, Mutation
from pidfence.sim.runner import SimResult, run

__all__ = ["Knobs", "Mutation", "SimResult", "run"]
