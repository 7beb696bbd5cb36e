"""``python -m pidfence.testing.run [FAULTS] -- PIDFENCE_ARGS``: the ``pidfence`` CLI under test.

Installs what the options ask for in this process, then runs the normal CLI with
``PIDFENCE_ARGS``:

* ``--crash-at POINT``: SIGKILL this process's group at a sink crash point (this process becomes
  the leader of a session of its own, if it is not one already);
* ``--hold-at POINT --hold-dir DIR``: the first process of the sink to reach ``POINT`` waits
  there until the test releases it (:func:`pidfence.testing.sink_faults.hold`);
* ``--fail-first-attempt``: every sink task's first attempt fails (Spark retries it);
* ``--mutation NAME``: a deliberately broken build (:mod:`pidfence.testing.mutations`).

Sink hooks reach the Python processes Spark starts through ``PYSPARK_PYTHON``, pointed at a
wrapper (:mod:`pidfence.testing.spark_python`) that installs the same hook there. Run the CLI
without this module to run it without faults (e.g. the restart after a crash).
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

from pidfence.services.process import pid_alive
from pidfence.spark_sink.crash_points import POINTS
from pidfence.testing.mutations import MUTATIONS, install_mutation
from pidfence.testing.sink_faults import SinkFaults, lead_own_session
from pidfence.testing.spark_python import python_wrapper


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pidfence.testing.run",
        description="Run the pidfence CLI with test faults installed.",
    )
    parser.add_argument("--crash-at", choices=POINTS, help="SIGKILL the sink at this point")
    parser.add_argument("--hold-at", choices=POINTS, help="wait at this point until released")
    parser.add_argument("--hold-dir", help="the folder where the test releases a hold")
    parser.add_argument("--fail-first-attempt", action="store_true")
    parser.add_argument(
        "--mutation",
        action="append",
        default=[],
        choices=sorted(MUTATIONS),
        help="install a broken build in this process only (producers, copiers, lease servers; "
        "not in the Python workers Spark starts, where the sink's rules run)",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then pidfence's arguments")
    return parser


_FOLDER_PREFIX = "pidfence-testing-"


def _sweep_folders_of_dead_runs() -> None:
    """Remove the wrapper folders of earlier runs that died at a crash point (no ``atexit``)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_FOLDER_PREFIX}*-*"):
        pid = folder.name.removeprefix(_FOLDER_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """Install the faults, then run ``pidfence`` with the arguments after ``--``."""
    options = _parser().parse_args(argv)
    args = list(options.args)
    if args[:1] == ["--"]:
        args = args[1:]
    group = lead_own_session() if options.crash_at else None
    hold_dir = options.hold_dir and str(Path(options.hold_dir).resolve())
    faults = SinkFaults(
        options.crash_at, group, options.fail_first_attempt, options.hold_at, hold_dir
    )
    if faults.active:
        faults.install()
        _sweep_folders_of_dead_runs()
        folder = Path(tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-"))
        atexit.register(shutil.rmtree, folder, True)  # a crash point skips it: see the sweep
        os.environ["PYSPARK_PYTHON"] = str(python_wrapper(faults, folder))
    for name in options.mutation:
        install_mutation(name)
    # Hand the process to the installed ``pidfence`` command, as a shell would: this launcher
    # sits below the CLI in the layers and does not import it.
    (command,) = entry_points(group="console_scripts", name="pidfence")
    sys.argv = ["pidfence", *args]
    command.load()()


if __name__ == "__main__":
    main()
