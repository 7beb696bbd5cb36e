"""Per-record MACs in the sink: which rows of a batch carry a ``pfm`` that does not verify.

The optional per-record mode (DESIGN.md §3 amended again, ``docs/security.md``): every
idempotent record (data and FENCE) must carry the MAC its lease's key gives it. A row that does
not is ``FORGED`` (reason ``mac``) before the rules see it, so a topic writer who learned a live
producer's next seq cannot take that seq. Header-less and pid-0 records are not idempotent and
are not checked; malformed ``pf`` headers stay ``MALFORMED``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pidfence.broker_plugin.decode import DecodedHeaders
from pidfence.wire.mac import RecordMacCheck


def mac_forged(
    check: RecordMacCheck,
    topic: str,
    partition: int,
    dec: DecodedHeaders,
    keys: pa.Array | pa.ChunkedArray,
    values: pa.Array | pa.ChunkedArray,
    macs: pa.Array | pa.ChunkedArray,
) -> npt.NDArray[np.bool_]:
    """Per row: an idempotent record whose ``pfm`` is missing or wrong.

    Args:
        check: the MAC check holding the lease servers' ``--record-mac-secret``.
        topic, partition: where the rows were read.
        dec: the rows' decoded ``pf`` headers.
        keys, values: the rows' Kafka keys and values.
        macs: the rows' ``pfm`` header values (null when absent).
    """
    n = len(dec.pid)
    forged = np.zeros(n, dtype=bool)
    rows = np.flatnonzero(dec.present & ~dec.malformed & (dec.pid != 0))
    if not len(rows):
        return forged
    pid, gen, seq, flags = (
        dec.pid.tolist(),
        dec.generation.tolist(),
        dec.seq.tolist(),
        dec.flags.tolist(),
    )
    key_l, value_l, mac_l = keys.to_pylist(), values.to_pylist(), macs.to_pylist()
    valid = check.valid
    for r in rows.tolist():
        if not valid(
            topic, partition, pid[r], gen[r], seq[r], flags[r], key_l[r], value_l[r], mac_l[r]
        ):
            forged[r] = True
    return forged
