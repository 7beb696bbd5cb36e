"""The command line of ``python -m pidfence.testing.run``, for tests and scripts that start it.

Kept apart from :mod:`pidfence.testing.run` (the entry point itself), so importing the argv
builder never imports the module that ``-m`` is about to run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

#: The module's command line, for building argv in tests and scripts.
RUN = (sys.executable, "-m", "pidfence.testing.run")


def run_argv(
    pidfence_args: Sequence[str],
    crash_at: str | None = None,
    fail_first_attempt: bool = False,
    mutations: Sequence[str] = (),
    hold_at: tuple[str, Path] | None = None,
) -> list[str]:
    """The argv that runs ``pidfence PIDFENCE_ARGS`` with these faults installed.

    Args:
        pidfence_args: the CLI's arguments (``["sink", "--bootstrap", ...]``), or a whole command
            line that runs the CLI with ``python -c`` (``pidfence.demo.procs.pidfence_argv``);
            its interpreter prefix is dropped.
        crash_at: a sink crash point.
        fail_first_attempt: fail every sink task's first attempt.
        mutations: names of :data:`pidfence.testing.mutations.MUTATIONS` to install.
        hold_at: ``(point, folder)``: hold the sink at a crash point until the test releases it
            (:func:`pidfence.testing.sink_faults.hold`).
    """
    args = list(pidfence_args)
    if args[:2] == [sys.executable, "-c"]:
        args = args[3:]
    argv = list(RUN)
    if crash_at is not None:
        argv += ["--crash-at", crash_at]
    if fail_first_attempt:
        argv.append("--fail-first-attempt")
    for name in mutations:
        argv += ["--mutation", name]
    if hold_at is not None:
        argv += ["--hold-at", hold_at[0], "--hold-dir", str(hold_at[1])]
    return [*argv, "--", *args]
