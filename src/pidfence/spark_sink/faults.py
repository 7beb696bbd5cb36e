"""Fault injection for the exactly-once tests (off unless the environment asks for it).

``PIDFENCE_SINK_CRASH_AT=after_write|before_manifest|rejects_committed|after_manifest`` SIGKILLs
the whole process group of the sink at that point (``before_manifest``: the batch's files are
written, nothing is committed; ``rejects_committed``: the Delta layout committed the rejects table,
not yet the log table; ``after_manifest``: the batch is committed, Spark's commit log not yet):
the driver, its JVM and the Python workers die together, like a lost machine. It only fires when
``PIDFENCE_SINK_CRASH_PGID`` names the current process group or session (PySpark's workers have a
process group of their own inside the driver's session), so run the sink as a session leader
(``subprocess.Popen(..., start_new_session=True)``) and set that variable to the child's pid, or
to ``self`` (``pidfence sink`` then substitutes its own pid); restart without the variables (so
it fires once).

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
POINTS: Final = ("after_write", "before_manifest", "rejects_committed", "after_manifest")


def resolve_self_pgid() -> None:
    """Replace ``PIDFENCE_SINK_CRASH_PGID=self`` with this process's pid (before Spark starts).

    Call it in the driver before the JVM and Python workers are launched, so they inherit the
    number. It only ever fires when this process leads its own group (see :func:`crash_point`).
    """
    if os.environ.get(CRASH_PGID) == "self":
        os.environ[CRASH_PGID] = str(os.getpid())


def crash_point(point: str) -> None:
    """SIGKILL this process group if the environment asks for a crash at ``point``."""
    if os.environ.get(CRASH_AT) != point:
        return
    pgid = os.environ.get(CRASH_PGID)
    if pgid is None or not pgid.isdigit():
        return
    leader = int(pgid)
    # PySpark's daemon puts its Python workers in a group of their own (setpgid), still inside
    # the driver's session: a worker fires when the driver it belongs to leads that session.
    if leader not in (os.getpgrp(), os.getsid(0)):
        return
    own = os.getpgrp()
    if own != leader:
        os.killpg(leader, signal.SIGKILL)
    os.killpg(own, signal.SIGKILL)


def fail_first_attempt(attempt: int) -> bool:
    """Whether ``write()`` should fail now (task retry test)."""
    return os.environ.get(FAIL_ATTEMPT0) == "1" and attempt == 0
