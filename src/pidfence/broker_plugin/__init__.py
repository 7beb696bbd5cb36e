"""The broker-side rules (DESIGN §4): per-partition producer state, verdicts, snapshots.

Pure computation: no I/O beyond (de)serialising bytes. The Spark sink and the simulation run the
same code.
"""

from pidfence.broker_plugin.batch import BatchResult, offer_batch
from pidfence.broker_plugin.decision import CODE_OF, VERDICT_CODES, Decision
from pidfence.broker_plugin.decode import DecodedHeaders, decode_headers
from pidfence.broker_plugin.entry import MAX_HOLES, PENDING_LIMIT, Authority, Gap, GapKind, Verifier
from pidfence.broker_plugin.errors import CorruptSnapshot
from pidfence.broker_plugin.rebuild import (
    RECORDED_RULES,
    REPLAYED_FORGERY,
    REPLAYED_PROOF,
    rebuild,
    recorded_authority,
    replay_batch,
    replay_cert,
    replay_verifier,
    rules_of,
)
from pidfence.broker_plugin.table import ProducerStateTable

__all__ = [
    "CODE_OF",
    "MAX_HOLES",
    "PENDING_LIMIT",
    "RECORDED_RULES",
    "REPLAYED_FORGERY",
    "REPLAYED_PROOF",
    "VERDICT_CODES",
    # batch path
    "BatchResult",
    # errors
    "CorruptSnapshot",
    "DecodedHeaders",
    # rules
    "Decision",
    "Gap",
    "GapKind",
    "Authority",
    "ProducerStateTable",
    "decode_headers",
    "offer_batch",
    "Verifier",
    "rebuild",
    "recorded_authority",
    "replay_batch",
    "replay_cert",
    "replay_verifier",
    "rules_of",
]
