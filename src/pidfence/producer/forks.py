"""A producer belongs to the process that created it.

After ``fork()`` the child holds a copy of the parent's lease (pid, generation, next seqs) and
of librdkafka's handle without its threads. Sending from both would put two processes on one
lease: the same (pid, generation, seq) for different records, and the sink keeps only the first.
So in the child, right after the fork (``os.register_at_fork``: nothing on the per-record path),
every producer the parent created turns into one whose every attribute raises
:class:`~pidfence.producer.errors.ProducerForked`. The parent's copy is untouched.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from pidfence.producer.errors import ProducerForked

_owned: weakref.WeakSet[Any] = weakref.WeakSet()


def register(producer: Any) -> None:
    """Refuse every use of ``producer`` in a process forked from this one."""
    object.__setattr__(producer, "_created_by", os.getpid())
    _owned.add(producer)


def _refuse(self: Any, name: str) -> Any:
    if name == "__class__":
        return type(self)
    raise ProducerForked(
        f"this producer was created by process {object.__getattribute__(self, '_created_by')} "
        f"and process {os.getpid()} is a fork of it: two processes must never send under one "
        "lease. Create the producer after the fork, in the process that uses it (gunicorn: per "
        "worker, e.g. in post_fork; multiprocessing: inside the target function)"
    )


def _in_child() -> None:
    forked: dict[type, type] = {}
    for producer in list(_owned):
        cls = type(producer)
        if cls not in forked:  # the same layout, so the instance can switch to it
            attrs = {"__getattribute__": _refuse, "__slots__": ()}
            forked[cls] = type(f"Forked{cls.__name__}", (cls,), attrs)
        producer.__class__ = forked[cls]
    _owned.clear()


os.register_at_fork(after_in_child=_in_child)
