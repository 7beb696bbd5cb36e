"""The checker (DESIGN §8), the send ledger it reads, and the downstream job of seed 003."""

from pidfence.verify.check import (
    ANOMALIES,
    INFORMATIONAL,
    LOG_COLUMNS,
    REJECT_COLUMNS,
    CheckReport,
    Finding,
    check,
)
from pidfence.verify.downstream import truth_from_ledger, unique_users_per_minute
from pidfence.verify.ledger import LedgerEntry, LedgerWriter, read_ledger, value_digest

__all__ = [
    "ANOMALIES",
    "INFORMATIONAL",
    "LOG_COLUMNS",
    "REJECT_COLUMNS",
    "CheckReport",
    "Finding",
    "LedgerEntry",
    "LedgerWriter",
    "check",
    "read_ledger",
    "truth_from_ledger",
    "unique_users_per_minute",
    "value_digest",
]
