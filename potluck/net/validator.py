"""hivemind record validator: every DHT record passes ``envelope.verify`` before a node stores or returns it.

hivemind calls ``validate`` when another node asks us to store a record and when a node answers our
lookup, so forged, stale, oversized or foreign records are dropped at the DHT boundary. Readers verify
again when they decode (``potluck.net.node``): defence in depth, and the only path to a typed record.
"""

from __future__ import annotations

import logging

from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import get_dht_time

from potluck.protocol.envelope import TrustPolicy, verify
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
