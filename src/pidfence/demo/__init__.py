"""``pidfence demo``: the whole pipeline with injected faults (the chaos tests share its
process and fault helpers from :mod:`pidfence.demo.procs` and :mod:`pidfence.demo.faults`)."""

from pidfence.demo.config import BadDemoOption, DemoConfig, Fault, SinkStore, parse_faults
from pidfence.demo.runner import run_demo

__all__ = ["BadDemoOption", "DemoConfig", "Fault", "SinkStore", "parse_faults", "run_demo"]
