"""The broker-side rules (DESIGN §4): per-partition producer state, verdicts, snapshots.

Pure computation: no I/O beyond (de)serialising bytes. The Spark sink and the simulation run the
same code. The batch path (``offer_batch``, ``decode_headers``) needs numpy and pyarrow (the
``sink`` extra) and is imported on first use, so a producer's recovery imports neither.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from pidfence.broker_plugin.decision import CODE_OF, VERDICT_CODES, Decision
from pidfence.broker_plugin.entry import Gap, GapKind, Verifier
from pidfence.broker_plugin.errors import CorruptSnapshot
from pidfence.broker_plugin.rebuild import (
    REPLAYED_FORGERY,
    REPLAYED_PROOF,
    rebuild,
    replay_batch,
    replay_cert,
    replay_verifier,
)
from pidfence.broker_plugin.table import ProducerStateTable

if TYPE_CHECKING:
    from pidfence.broker_plugin.batch import BatchResult, offer_batch
    from pidfence.broker_plugin.decode import DecodedHeaders, decode_headers

_BATCH_PATH = {
    "BatchResult": "batch",
    "offer_batch": "batch",
    "DecodedHeaders": "decode",
    "decode_headers": "decode",
}


def __getattr__(name: str) -> Any:
    if name in _BATCH_PATH:
        return getattr(import_module(f"pidfence.broker_plugin.{_BATCH_PATH[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CODE_OF",
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
    "ProducerStateTable",
    "decode_headers",
    "offer_batch",
    "Verifier",
    "rebuild",
    "replay_batch",
    "replay_cert",
    "replay_verifier",
]
