"""Which rows of a shared output the sink wrote (DESIGN §7 amended).

Other writers may append to a Delta output, and users delete rows from it (retention, GDPR).
The sink's own account of what it appended (``pidfence.spark_sink.read_written``: identity,
``log_offset`` and Kafka offset of every row, from its commits) tells the rows apart: a log row
is the sink's when its identity and offsets are one the sink wrote, as many copies as the account
lists (one, unless the sink itself wrote a row twice: then both copies are judged, and the
checker reports the ``duplicate``); further copies are another writer's (``foreign``), as are
rows the account does not list; written rows no longer in the table were removed after commit
(``deleted`` when the table's history shows an operation that removes rows, else ``lost``:
:mod:`pidfence.verify.removals`). The checker judges exactly-once on the sink's rows only.

A copy another writer appended of one of the sink's rows cannot be told from one the sink wrote
by its contents: it is the sink's row, byte for byte. Where a row is tells more: every row in a
data file the sink's manifests name (``PartFiles.log``, ``data/QUERY/BATCH/...``) is the sink's,
however many copies of it the file holds, so a copy the sink itself wrote beyond its account is
judged (the checker reports the ``duplicate``), never passed as ``foreign``. Rows in other files
(another writer's, or files compaction wrote in place of the sink's) are the sink's by the
account's multiplicity, after the rows in the sink's own files have used it up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from pidfence.verify.errors import VerifyInputError

#: What identifies one written row: where the sink put it and what it was.
KEY: Final = ("topic", "partition", "log_offset", "offset", "pid", "generation", "seq")


@dataclass(frozen=True)
class Provenance:
    """A log split by who wrote each row.

    Attributes:
        own: the log rows the sink wrote (in the log's order), as many copies of a key as the
            sink's account lists.
        foreign: rows another writer appended, copies of the sink's rows included.
        deleted: rows the sink wrote (``KEY`` columns, and ``batch`` when the account has it)
            that the log no longer holds.
    """

    own: pa.Table
    foreign: pa.Table
    deleted: pa.Table


def _keys(table: pa.Table, name: str) -> list[tuple[object, ...]]:
    missing = [c for c in KEY if c not in table.column_names]
    if missing:
        raise VerifyInputError(
            f"{name} table lacks column(s) {missing}; expected {list(KEY)} "
            "(read it with pidfence.spark_sink.read_log / read_written)"
        )
    return list(zip(*(table.column(c).to_pylist() for c in KEY), strict=True))


def split(
    log: pa.Table, written: pa.Table, in_own_files: Sequence[bool] | None = None
) -> Provenance:
    """Split ``log`` by ``written`` (the sink's own account of its appended rows).

    Args:
        log: the output log as read (``read_log``), any extra columns.
        written: the rows the sink appended, at least the ``KEY`` columns (``batch`` too, for
            telling a delete from a loss).
        in_own_files: per log row, whether it is in a data file the sink's commits added
            (``read_log(with_files=True)`` and ``read_data_files``); None: no row is known to be.

    Raises:
        VerifyInputError: either table lacks a ``KEY`` column, or ``in_own_files`` is not one
            flag per log row.
    """
    left = _keys(log, "log")
    right = _keys(written, "written")
    owned = [False] * len(left) if in_own_files is None else [bool(f) for f in in_own_files]
    if len(owned) != len(left):
        raise VerifyInputError(f"{len(owned)} file flags for {len(left)} log rows")
    unclaimed = Counter(right)
    mine = list(owned)
    for index, key in enumerate(left):  # the sink's own files first: every copy there is its
        if owned[index] and unclaimed[key] > 0:
            unclaimed[key] -= 1
    for index, key in enumerate(left):
        if not owned[index] and unclaimed[key] > 0:  # a key with a null never is one
            unclaimed[key] -= 1
            mine[index] = True
    gone = []
    for index, key in enumerate(right):
        if unclaimed[key] > 0:
            unclaimed[key] -= 1
            gone.append(index)
    mask = pa.array(mine, pa.bool_())
    own, foreign = log.filter(mask), log.filter(pc.invert(mask))
    return Provenance(own, foreign, written.take(pa.array(gone, pa.int64())))


__all__ = ["KEY", "Provenance", "split"]
