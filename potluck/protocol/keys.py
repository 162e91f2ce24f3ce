"""DHT keys and MQTT topics of a swarm, their lifetimes, and the protocol version.

Every DHT key is ``potluck/<swarm>/<name>``; record kinds are fixed per name so a validator knows which
schema and which signer a key requires. Lifetimes are upper bounds a validator enforces: a record whose
expiration lies further ahead is refused, so a leaked or replayed record cannot outlive its purpose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from potluck.protocol.errors import RecordError

PROTOCOL_VERSION = 1

# Swarm ids appear in keys, topics and file names: keep them short and boring.
SWARM_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class KeySpec:
    """What may be stored under one DHT key name."""

    name: str
    kind: str  # record kind expected in the envelope
    signer: str  # "subkey": signed by the peer named by the subkey; "coordinator": by the job's owner
    max_ttl_s: float  # furthest allowed expiration, seconds after now


PEERS = KeySpec("peers", "PeerRecord", signer="subkey", max_ttl_s=300.0)
LINKS = KeySpec("links", "LinkReport", signer="subkey", max_ttl_s=3600.0)
JOB = KeySpec("job", "JobSpec", signer="coordinator", max_ttl_s=3600.0)
PLAN = KeySpec("plan", "TrainPlan", signer="coordinator", max_ttl_s=3600.0)
PROGRESS = KeySpec("progress", "Progress", signer="subkey", max_ttl_s=600.0)
BANS = KeySpec("bans", "BanList", signer="coordinator", max_ttl_s=3600.0)
TOKENS = KeySpec("tokens", "TokenUses", signer="coordinator", max_ttl_s=3600.0)

KEY_SPECS: dict[str, KeySpec] = {
    spec.name: spec for spec in (PEERS, LINKS, JOB, PLAN, PROGRESS, BANS, TOKENS)
}


def check_swarm_id(swarm_id: str) -> str:
    if not SWARM_ID_RE.match(swarm_id):
        raise RecordError(
            f"invalid swarm id {swarm_id!r}: use 1-63 characters of a-z, 0-9 and '-', starting alphanumeric"
        )
    return swarm_id


def dht_key(swarm_id: str, name: str) -> str:
    """The DHT key under which records named ``name`` of swarm ``swarm_id`` live."""
    check_swarm_id(swarm_id)
    if name not in KEY_SPECS:
        raise RecordError(f"unknown record name {name!r}; known: {sorted(KEY_SPECS)}")
    return f"potluck/{swarm_id}/{name}"


def mqtt_topic(swarm_id: str, *parts: str) -> str:
    """An MQTT topic under the swarm, e.g. ``potluck/<swarm>/peer/<id>/status``."""
    check_swarm_id(swarm_id)
    return "/".join(("potluck", swarm_id, *parts))
