"""Who may take part in a swarm: join tokens the coordinator mints, admissions it signs, bans it publishes.

- A **join token** rides in the invite: ``pltok1.`` + base64url of ``msgpack([swarm, token id, expires,
  max_uses, roles]) || signature``, signed by the coordinator's key. Anyone holding that key can mint one
  (``potluck invite``), offline; the coordinator counts its uses.
- A peer trades the token for an **admission** over a stream to the coordinator (``net/admit.py`` and
  ``coordinator/admission.py``): ``msgpack([magic, swarm, peer id, expires, roles, signature])``. The peer
  attaches it to every record it signs (``envelope.seal``); every node refuses a peer-signed record whose
  admission is missing, expired, for another peer or swarm, or not signed by the coordinator, so the DHT,
  the coordinator and other peers ignore a stranger before reading a word of what it says.
- A **ban** is a coordinator-signed ``BanList`` record: every node refuses the banned peers' records
  from its next read of the list (one heartbeat), and the coordinator neither renews nor grants them.
- **Token uses** (``TokenUses``, coordinator-signed, under the ``tokens`` key) keep the peers each
  limited token admitted, so a restarted coordinator, on any machine holding its key, counts on.

Checks run cheapest first, and on byte sizes fixed before anything is decoded.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack
from pydantic import BaseModel, ConfigDict, Field

from potluck.protocol import identity as ident
from potluck.protocol.errors import AdmissionError
from potluck.protocol.records import NonNegFloat, PeerId, Record

ADMISSION_MAGIC = b"PLA1"
TOKEN_PREFIX = "pltok1."
ADMISSION_DOMAIN = b"potluck/admission/v1\x00"
TOKEN_DOMAIN = b"potluck/join-token/v1\x00"
MAX_ADMISSION_BYTES = 512
MAX_TOKEN_CHARS = 512
ROLES = ("peer",)  # what an admitted peer may do: today, train (room for e.g. "observer")
OWNER_ROLE_PREFIX = "job:"  # + a job name: the admitted key owns that job's records (keys.JobKeys)
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_BANS = 4096
MAX_TOKENS_KEPT = 256  # limited tokens whose uses are remembered (the newest to expire first)
MAX_USERS_KEPT = 1024  # peers remembered per token; a token for more peers is counted from there on


@dataclass(frozen=True)
class Admission:
    """The coordinator's word that ``peer_id`` may take part in ``swarm_id`` until ``expires``."""

    swarm_id: str
    peer_id: str
    expires: float  # DHT time (unix seconds)
    roles: tuple[str, ...]
    signature: bytes

    @classmethod
    def issue(
        cls, signer: ident.Identity, swarm_id: str, peer_id: str, expires: float, roles: tuple[str, ...]
    ) -> Admission:
        return cls(
            swarm_id,
            peer_id,
            float(expires),
            roles,
            signer.sign(_admission_message(swarm_id, peer_id, expires, roles)),
        )

    def encode(self) -> bytes:
        fields = [
            ADMISSION_MAGIC,
            self.swarm_id,
            self.peer_id,
            self.expires,
            list(self.roles),
            self.signature,
        ]
        return bytes(msgpack.packb(fields, use_bin_type=True))

    @classmethod
    def decode(cls, data: Any) -> Admission:
        if not isinstance(data, bytes) or len(data) > MAX_ADMISSION_BYTES:
            raise AdmissionError("admission is not a byte string of at most 512 bytes")
        fields = _unpack(data, "admission")
        if not (isinstance(fields, list) and len(fields) == 6 and fields[0] == ADMISSION_MAGIC):
            raise AdmissionError("malformed admission")
        _, swarm, peer, expires, roles, sig = fields
        if not (isinstance(swarm, str) and isinstance(peer, str) and isinstance(sig, bytes)):
            raise AdmissionError("malformed admission (field types)")
        return cls(swarm, peer, _finite(expires, "admission"), _roles(roles), sig)

    def check(self, swarm_id: str, coordinator_key: bytes, peer_id: str, now: float, skew_s: float) -> None:
        """Raise ``AdmissionError`` unless this admits ``peer_id`` to ``swarm_id`` at ``now``."""
        if self.swarm_id != swarm_id:
            raise AdmissionError(f"admission is for swarm {self.swarm_id!r}")
        if self.peer_id != peer_id:
            raise AdmissionError("admission belongs to another peer")
        if self.expires < now - skew_s:
            raise AdmissionError(f"admission expired {now - self.expires:.0f} s ago")
        message = _admission_message(self.swarm_id, self.peer_id, self.expires, self.roles)
        if not ident.verify(coordinator_key, message, self.signature):
            raise AdmissionError("admission not signed by the swarm's coordinator")


@dataclass(frozen=True)
class JoinToken:
    """What an invite's token allows: ``max_uses`` peers (0: any number) until ``expires``."""

    swarm_id: str
    token_id: str  # 16 hex digits; the coordinator counts uses per id
    expires: float
    max_uses: int
    roles: tuple[str, ...]

    @classmethod
    def mint(
        cls,
        signer: ident.Identity,
        swarm_id: str,
        expires: float,
        max_uses: int = 0,
        roles: tuple[str, ...] = ROLES,
    ) -> str:
        """A fresh token's text, for ``Invite.token``."""
        claims = [swarm_id, os.urandom(8).hex(), float(expires), int(max_uses), list(roles)]
        body = bytes(msgpack.packb(claims, use_bin_type=True))
        blob = body + signer.sign(TOKEN_DOMAIN + body)
        return TOKEN_PREFIX + base64.urlsafe_b64encode(blob).decode("ascii").rstrip("=")

    @classmethod
    def verify(cls, text: Any, swarm_id: str, coordinator_key: bytes, now: float) -> JoinToken:
        """The token's claims; ``AdmissionError`` if it is malformed, forged, for another swarm or expired."""
        if not isinstance(text, str) or not text.startswith(TOKEN_PREFIX) or len(text) > MAX_TOKEN_CHARS:
            raise AdmissionError("no valid join token: ask the swarm's owner for a fresh invite")
        b64 = text[len(TOKEN_PREFIX) :]
        try:
            blob = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
        except (binascii.Error, ValueError):
            raise AdmissionError("join token is not base64url") from None
        body, sig = blob[: -ident.SIGNATURE_BYTES], blob[-ident.SIGNATURE_BYTES :]
        if len(blob) <= ident.SIGNATURE_BYTES or not ident.verify(coordinator_key, TOKEN_DOMAIN + body, sig):
            raise AdmissionError("join token not signed by the swarm's coordinator")
        fields = _unpack(body, "join token")
        if not (isinstance(fields, list) and len(fields) == 5):
            raise AdmissionError("malformed join token")
        swarm, token_id, expires, max_uses, roles = fields
        if not (isinstance(swarm, str) and isinstance(token_id, str) and isinstance(max_uses, int)):
            raise AdmissionError("malformed join token (field types)")
        token = cls(swarm, token_id, _finite(expires, "join token"), max_uses, _roles(roles))
        if token.swarm_id != swarm_id:
            raise AdmissionError(f"join token is for swarm {token.swarm_id!r}")
        if token.expires < now:
            raise AdmissionError("join token expired: ask the swarm's owner for a fresh invite")
        return token


class BanList(Record):
    """Peers the coordinator no longer admits; stored under the ``bans`` key, signed by the coordinator."""

    KIND: ClassVar[str] = "BanList"

    peers: list[PeerId] = Field(default_factory=list, max_length=MAX_BANS)
    issued_at: NonNegFloat


class TokenUse(BaseModel):
    """The peers one limited join token admitted so far."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    token_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    expires: NonNegFloat
    peers: list[PeerId] = Field(default_factory=list, max_length=MAX_USERS_KEPT)


class TokenUses(Record):
    """Uses of the swarm's limited join tokens; stored under the ``tokens`` key, signed by the coordinator."""

    KIND: ClassVar[str] = "TokenUses"

    tokens: list[TokenUse] = Field(default_factory=list, max_length=MAX_TOKENS_KEPT)
    issued_at: NonNegFloat


def _admission_message(swarm_id: str, peer_id: str, expires: float, roles: tuple[str, ...]) -> bytes:
    return ADMISSION_DOMAIN + bytes(
        msgpack.packb([swarm_id, peer_id, float(expires), list(roles)], use_bin_type=True)
    )


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(
            data, raw=False, max_bin_len=256, max_str_len=256, max_array_len=16, max_map_len=0
        )
    except Exception:  # msgpack raises many types on garbage
        raise AdmissionError(f"malformed {what}") from None


def _finite(value: Any, what: str) -> float:
    if not isinstance(value, float | int) or not math.isfinite(value):
        raise AdmissionError(f"malformed {what} (expiry)")
    return float(value)


def owner_role(job: str) -> str:
    """The role of an admission whose holder owns ``job`` (signs its spec and plans)."""
    if not _JOB_NAME_RE.match(job):
        raise AdmissionError(f"invalid job name {job!r}")
    return OWNER_ROLE_PREFIX + job


def _known_role(role: object) -> bool:
    if not isinstance(role, str):
        return False
    job = role.removeprefix(OWNER_ROLE_PREFIX)
    return role in ROLES or (job != role and bool(_JOB_NAME_RE.match(job)))


def _roles(value: Any) -> tuple[str, ...]:
    if not (isinstance(value, list) and len(value) <= 4 and all(_known_role(r) for r in value)):
        raise AdmissionError(f"unknown roles {value!r}; known: {ROLES} and {OWNER_ROLE_PREFIX}<job>")
    return tuple(value)
