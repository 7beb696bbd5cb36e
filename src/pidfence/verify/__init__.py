"""The checker (DESIGN §8), the send ledger it reads, and the downstream job of seed 003."""

from pidfence.ledger import LedgerEntry, LedgerWriter, read_ledger, value_digest
from pidfence.verify.check import (
    ANOMALIES,
    INFORMATIONAL,
    LOG_COLUMNS,
    REJECT_COLUMNS,
    CheckReport,
    check,
)
from pidfence.verify.downstream import truth_from_ledger, unique_users_per_minute
from pidfence.verify.errors import VerifyInputError
from pidfence.verify.finding import Finding
from pidfence.verify.output import verify_output

__all__ = [
    "ANOMALIES",
    "INFORMATIONAL",
    "LOG_COLUMNS",
    "REJECT_COLUMNS",
    "CheckReport",
    "Finding",
    "LedgerEntry",
    "LedgerWriter",
    "VerifyInputError",
    "check",
    "read_ledger",
    "truth_from_ledger",
    "unique_users_per_minute",
    "value_digest",
    "verify_output",
]
