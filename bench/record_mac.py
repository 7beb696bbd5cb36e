"""``pidfence bench record_mac``: the CPU cost of one per-record MAC (``pidfence.wire.mac``).

What a producer pays per record in the optional per-record mode (and a sink per record it
checks): for 100-byte and 1 KiB values, ``record_mac`` (keys BLAKE2b every call), the hot-loop form
``record_mac_from`` (keyed once per lease, ``copy()`` per record) and ``check_record_mac``. Each
figure is the best of several ``timeit`` repeats, in ns per record, on one core; the best repeat is
the one other work on a shared machine disturbed least. For scale: ``msgpack.packb`` of a ``pf``
header, which every record pays already.
"""

from __future__ import annotations

import os
import timeit
from collections.abc import Callable

from rich.progress import Progress

from pidfence.benchkit import BenchReport
from pidfence.wire import (
    check_record_mac,
    derive_record_key,
    encode_pf,
    record_hasher,
    record_mac,
    record_mac_from,
)

SIZES = (100, 1024)


def _ns(fn: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e9


def run(quick: bool, progress: Progress) -> BenchReport:
    """Time the MAC of one record for each value size."""
    number, repeat = (20_000, 5) if quick else (200_000, 9)
    key = derive_record_key(os.urandom(32), 123456789)
    hasher = record_hasher(key)
    rows = []
    task = progress.add_task("record MAC", total=len(SIZES))
    for size in SIZES:
        value, rkey = os.urandom(size), b"customer-00042"
        mac = record_mac(key, "orders", 7, 123456789, 42, 1_000_000, 0, rkey, value)

        def one() -> bytes:
            return record_mac(key, "orders", 7, 123456789, 42, 1_000_000, 0, rkey, value)  # noqa: B023

        def keyed() -> bytes:
            return record_mac_from(hasher, "orders", 7, 123456789, 42, 1_000_000, 0, rkey, value)  # noqa: B023

        def check() -> bool:
            return check_record_mac(key, "orders", 7, 123456789, 42, 1_000_000, 0, rkey, value, mac)  # noqa: B023

        rows.append(
            {
                "value_bytes": size,
                "record_mac_ns": round(_ns(one, number, repeat)),
                "record_mac_from_ns": round(_ns(keyed, number, repeat)),
                "check_record_mac_ns": round(_ns(check, number, repeat)),
                "pf_header_ns": round(_ns(lambda: encode_pf(1, 2, 1_000_000), number, repeat)),
            }
        )
        progress.advance(task)
    return BenchReport(
        title="Per-record MAC: CPU per record (one core, best of repeats)",
        columns=[
            "value_bytes",
            "record_mac_ns",
            "record_mac_from_ns",
            "check_record_mac_ns",
            "pf_header_ns",
        ],
        rows=rows,
        notes=[
            "record_mac keys BLAKE2b on every call; record_mac_from copies a state keyed once per "
            "lease (what a producer's hot loop should use); check_record_mac = record_mac + a "
            "constant-time compare.",
            f"Load average (1 min) {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.",
        ],
        params={"number": number, "repeat": repeat},
    )
