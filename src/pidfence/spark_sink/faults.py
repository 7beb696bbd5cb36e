"""Fault injection for the exactly-once tests (off unless the environment asks for it).

``PIDFENCE_SINK_CRASH_AT=after_write|before_manifest|after_manifest`` SIGKILLs the whole process
group of the sink at that point: the driver, its JVM and the Python workers die together, like a
lost machine. It only fires when ``PIDFENCE_SINK_CRASH_PGID`` names the current process group, so
run the sink as a session leader (``subprocess.Popen(..., start_new_session=True)``) and set that
variable to the child's pid; restart without the variables (so it fires once).

``PIDFENCE_SINK_FAIL_ATTEMPT0=1`` makes ``write()`` raise on every task's first attempt (use a
master such as ``local[2,3]`` so Spark retries tasks).
"""

from __future__ import annotations

import os
import signal
from typing import Final

CRASH_AT: Final = "PIDFENCE_SINK_CRASH_AT"
CRASH_PGID: Final = "PIDFENCE_SINK_CRASH_PGID"
FAIL_ATTEMPT0: Final = "PIDFENCE_SINK_FAIL_ATTEMPT0"
POINTS: Final = ("after_write", "before_manifest", "after_manifest")


def crash_point(point: str) -> None:
    """SIGKILL this process group if the environment asks for a crash at ``point``."""
    if os.environ.get(CRASH_AT) != point:
        return
    pgid = os.environ.get(CRASH_PGID)
    if pgid is None or not pgid.isdigit() or int(pgid) != os.getpgrp():
        return
    os.killpg(int(pgid), signal.SIGKILL)


def fail_first_attempt(attempt: int) -> bool:
    """Whether ``write()`` should fail now (task retry test)."""
    return os.environ.get(FAIL_ATTEMPT0) == "1" and attempt == 0
