"""``python -m pidfence.sim --seed N [--knob value ...]``: replay one schedule and print it."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from pidfence.sim.knobs import MUTATIONS, Knobs
from pidfence.sim.runner import run


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the schedule, print the report; exit 0 when it is clean."""
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
    knobs = {k: v for k, v in args.items() if v is not None}
    result = run(seed, **knobs)
    lines = [result.describe()]
    for name, finding in result.report.findings.items():
        lines += [f"  {name}: {example}" for example in finding.examples]
    lines += [f"  not FORGED: {f} -> {v}" for f, v in result.forgeries if v != "FORGED"]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
