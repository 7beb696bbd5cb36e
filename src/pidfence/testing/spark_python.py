"""The Python that Spark starts for a sink under test: install the sink's fault hook, then run.

Spark runs ``$PYSPARK_PYTHON -m MODULE`` for its daemon, workers and the streaming sink's commit
runner. :func:`python_wrapper` writes an executable that runs
``python -m pidfence.testing.spark_python SINKFAULTS_JSON -m MODULE``; this module installs the
hook of :class:`~pidfence.testing.sink_faults.SinkFaults` and then runs ``MODULE`` as
``__main__``, so executors (``write()``) and the commit runner (``commit()``) carry the hook too.
"""

from __future__ import annotations

import runpy
import shlex
import sys
from pathlib import Path

from pidfence.services.spark import worker_python_script
from pidfence.testing.sink_faults import SinkFaults


def python_wrapper(faults: SinkFaults, directory: Path) -> Path:
    """Write ``directory/python``: this interpreter with ``faults`` installed; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "python"
    command = shlex.join([sys.executable, "-m", __name__, faults.to_json()])
    script.write_text(worker_python_script(f'exec {command} "$@"'))
    script.chmod(0o755)
    return script


def main(argv: list[str]) -> None:
    """``SINKFAULTS_JSON [-u] -m MODULE [ARGS...]``: install the hook, run ``MODULE``."""
    if len(argv) < 3 or "-m" not in argv[1:]:
        raise SystemExit("usage: python -m pidfence.testing.spark_python JSON -m MODULE [ARGS]")
    SinkFaults.from_json(argv[0]).install()
    at = argv.index("-m", 1)
    module, rest = argv[at + 1], argv[at + 2 :]
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
