"""The send ledger, re-exported from :mod:`pidfence.ledger` (where the producer writes it)."""

from pidfence.ledger import (
    LedgerEntry,
    LedgerError,
    LedgerRefused,
    LedgerWriteFailed,
    LedgerWriter,
    ledger_files,
    read_ledger,
    value_digest,
)

__all__ = [
    "LedgerEntry",
    "LedgerError",
    "LedgerRefused",
    "LedgerWriteFailed",
    "LedgerWriter",
    "ledger_files",
    "read_ledger",
    "value_digest",
]
