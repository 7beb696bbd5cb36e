"""The ``pf`` header codec, the certificate and MAC formats, the shared value types and the
exception root. Pure but for the key and secret files ``cert`` and ``mac`` read and write."""

from pidfence.wire.authority import PidState, PidStatus
from pidfence.wire.cert import (
    CERT_HEADER_KEY,
    PRODUCER_KEY_BYTES,
    CertCheck,
    KeyFileError,
    encode_cert,
    generate_keypair,
    load_private_key,
    load_public_keys,
    verify_cert,
)
from pidfence.wire.errors import MalformedHeader, PidfenceError
from pidfence.wire.header import (
    FLAG_FENCE,
    GENERATION_LIMIT,
    MAX_HEADER_BYTES,
    PF_HEADER_KEY,
    PF_VERSION,
    PID_LIMIT,
    SEQ_LIMIT,
    PfHeader,
    decode_pf,
    decode_pf_fields,
    encode_pf,
    valid_fields,
)
from pidfence.wire.mac import (
    MAC_HEADER_KEY,
    RECORD_MAC_BYTES,
    RecordMacCheck,
    check_record_mac,
    derive_record_key,
    generate_mac_secret,
    load_mac_secret,
    record_hasher,
    record_mac,
    record_mac_from,
)
from pidfence.wire.verdict import Verdict

__all__ = [
    # the lease authority's answer about a pid
    "PidState",
    "PidStatus",
    # lease certificates (pfc)
    "CERT_HEADER_KEY",
    "PRODUCER_KEY_BYTES",
    "CertCheck",
    "KeyFileError",
    "encode_cert",
    "generate_keypair",
    "load_private_key",
    "load_public_keys",
    "verify_cert",
    # per-record MACs
    "MAC_HEADER_KEY",
    "RECORD_MAC_BYTES",
    "RecordMacCheck",
    "check_record_mac",
    "derive_record_key",
    "generate_mac_secret",
    "load_mac_secret",
    "record_hasher",
    "record_mac",
    "record_mac_from",
    # codec
    "FLAG_FENCE",
    "GENERATION_LIMIT",
    "MAX_HEADER_BYTES",
    "PF_HEADER_KEY",
    "PF_VERSION",
    "PID_LIMIT",
    "SEQ_LIMIT",
    # errors
    "MalformedHeader",
    "PfHeader",
    "PidfenceError",
    # types
    "Verdict",
    "decode_pf",
    "decode_pf_fields",
    "encode_pf",
    "valid_fields",
]
