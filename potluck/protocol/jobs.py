"""A job offered to a running swarm (``potluck launch --join``): its owner's signed ask for peers.

The owner trades the invite's token for an admission that names the job (``admission.owner_role``),
signs its ``JobSpec`` under the job's own key (``keys.JobKeys``) and a ``JobOffer`` under the swarm's
``jobs`` key (subkey: the owner's peer id, so one owner key offers one job at a time). The swarm's
coordinator allocates peers to the offered jobs it admitted (``coordinator/allocator.py``).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from potluck.protocol.records import Name, NonNegFloat, PeerId, Record

MAX_WEIGHT = 1000.0


class JobOffer(Record):
    """Signed by the job's owner (``peer_id``), under the ``jobs`` key."""

    KIND: ClassVar[str] = "JobOffer"

    peer_id: PeerId  # the owner: the subkey, and the signer
    job: Name
    weight: float = Field(default=1.0, gt=0.0, le=MAX_WEIGHT, allow_inf_nan=False)  # priority weight
    submitted_at: NonNegFloat  # when the owner first offered it (FIFO order), DHT time
    done: bool = False  # the job reached its last step: the owner's final word
    issued_at: NonNegFloat
