"""``python -m pidfence.sim --seed N [--knob value ...]``: replay one schedule and print it."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Any

from pidfence.sim.knobs import MUTATIONS, Knobs
from pidfence.sim.runner import run


def parse_replay(argv: list[str] | None = None) -> tuple[int, dict[str, Any]]:
    """The seed and the knobs of a replay command's arguments (what a failure prints after
    ``python -m pidfence.sim``), the knobs it does not name left at their defaults."""
    parser = argparse.ArgumentParser(prog="python -m pidfence.sim", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    defaults = Knobs()
    for f in fields(Knobs):
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(getattr(defaults, f.name), bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
            continue
        if f.name == "mutation":
            parser.add_argument(flag, choices=MUTATIONS, default=None)
            continue
        kind = float if f.name.endswith("_p") else int
        parser.add_argument(flag, type=kind, default=None)
    args = vars(parser.parse_args(argv))
    seed = args.pop("seed")
    return seed, {k: v for k, v in args.items() if v is not None}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the schedule, print the report; exit 0 when it is clean."""
    seed, knobs = parse_replay(argv)
    result = run(seed, **knobs)
    lines = [result.describe()]
    for name, finding in result.report.findings.items():
        lines += [f"  {name}: {example}" for example in finding.examples]
    lines += [f"  not FORGED: {f} -> {v}" for f, v in result.forgeries if v != "FORGED"]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
