"""Named fault points of the sink's commit protocol: no-ops unless a test harness installs a hook.

The sink calls :func:`crash_point` at each point; with no hook installed (production) the call
returns at once. ``pidfence.testing`` installs the one hook (SIGKILL the sink's process group at a
point, fail a task's first attempt) in the driver and in every Python process Spark starts for
it; production code reads no fault setting from anywhere.

Points, in the order a batch passes them:

* ``task_start``: ``write()`` begins on an executor (``attempt`` is Spark's task attempt number);
* ``after_write``: the task staged its files, nothing is committed;
* ``before_manifest``: the driver's ``commit()`` is about to publish the batch;
* ``rejects_committed``: the rejects table's Delta commit is done (a batch without rejects has
  none), not yet the log table's;
* ``after_manifest``: the batch is committed, Spark's commit log not yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

POINTS: Final = (
    "task_start",
    "after_write",
    "before_manifest",
    "rejects_committed",
    "after_manifest",
)

#: ``hook(point, attempt)``: may SIGKILL the process, raise, or return.
FaultHook = Callable[[str, int], None]

_hook: FaultHook | None = None


def crash_point(point: str, attempt: int = 0) -> None:
    """Call the installed hook at ``point`` (a no-op when none is installed)."""
    hook = _hook
    if hook is not None:
        hook(point, attempt)


def install_hook(hook: FaultHook | None) -> FaultHook | None:
    """Install ``hook`` (None removes it); returns the one it replaces.

    Called by ``pidfence.testing`` only; nothing in the sink installs a hook.
    """
    global _hook
    previous, _hook = _hook, hook
    return previous
