"""hivemind record validator: every DHT record passes ``envelope.verify`` before a node stores or returns it.

hivemind calls ``validate`` when another node asks us to store a record and when a node answers our
lookup, so forged, stale, oversized or foreign records are dropped at the DHT boundary. Readers verify
again when they decode (``potluck.net.node``): defence in depth, and the only path to a typed record.
"""

from __future__ import annotations

import logging
from typing import Any

from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import get_dht_time
from hivemind.utils.serializer import MSGPackSerializer

from potluck.protocol.envelope import TrustPolicy, Verified, key_id_bytes, subkey_bytes, verify
from potluck.protocol.errors import RecordError

logger = logging.getLogger(__name__)


class PotluckValidator(RecordValidatorBase):
    """Accepts only signed potluck envelopes of one swarm. Signing happens in the app, not here."""

    def __init__(self, policy: TrustPolicy) -> None:
        self.policy = policy
        self.rejected = 0  # count of refused records, exposed for metrics

    def validate(self, record: DHTRecord) -> bool:
        try:
            verify(
                self.policy, record.key, record.subkey, record.value, record.expiration_time, get_dht_time()
            )
        except RecordError as e:
            self.rejected += 1
            logger.debug("rejected DHT record: %s", e)
            return False
        return True

    @property
    def priority(self) -> int:
        return 10  # validate first, before any other validator strips anything

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False


def verify_read(
    policy: TrustPolicy, name: str, subkey: Any, value: bytes, expiration: float, now: float
) -> Verified:
    """``verify`` for a value as a DHT read hands it over (hivemind deserialized it: it is serialized
    again to check the exact signed bytes), or as a peer pushed it (``push.py``); ``RecordError`` if bad."""
    raw = MSGPackSerializer.dumps(value)
    return verify(policy, key_id_bytes(policy.swarm_id, name), subkey_bytes(subkey), raw, expiration, now)
