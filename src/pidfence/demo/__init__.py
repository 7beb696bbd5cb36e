"""``pidfence demo``: the whole pipeline with injected faults, and the process helpers the chaos
tests share with it."""

from pidfence.demo.config import BadDemoOption, DemoConfig, Fault, SinkStore, parse_faults
from pidfence.demo.faults import (
    CopierCrash,
    FaultScript,
    KillAndResume,
    LeaseZombie,
    Zombie,
    drive,
)
from pidfence.demo.procs import ProducerRole, ProducerSpec, Worker
from pidfence.demo.runner import run_demo

__all__ = [
    # running the demo
    "DemoConfig",
    "Fault",
    "SinkStore",
    "parse_faults",
    "run_demo",
    "BadDemoOption",
    # processes and faults (shared with tests/chaos)
    "ProducerRole",
    "ProducerSpec",
    "Worker",
    "FaultScript",
    "KillAndResume",
    "Zombie",
    "LeaseZombie",
    "CopierCrash",
    "drive",
]
