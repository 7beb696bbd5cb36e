"""The checker (DESIGN §8) and the send ledger it reads."""

from pidfence.verify.ledger import LedgerEntry, LedgerWriter, read_ledger, value_digest

__all__ = ["LedgerEntry", "LedgerWriter", "read_ledger", "value_digest"]
