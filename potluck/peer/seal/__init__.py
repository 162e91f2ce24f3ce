"""Sealed messages (``ledger.py``): one signature over a Merkle tree (``merkle.py``) of many messages,
either everything a peer sent its pipeline neighbours in a step, exchanged before the step's READY
(``exchange.py``), or the messages of an all-reduce chunk, each carrying the seal (``batch.py``)."""

from potluck.peer.seal.batch import Batches
from potluck.peer.seal.exchange import check_seals, deliver_seals
from potluck.peer.seal.ledger import (
    SEAL_BYTES,
    Key,
    Ledger,
    check_seal,
    key_of,
    payload_of,
    seal_alone,
)

__all__ = [
    "SEAL_BYTES",
    "Batches",
    "Key",
    "Ledger",
    "check_seal",
    "check_seals",
    "deliver_seals",
    "key_of",
    "payload_of",
    "seal_alone",
]
