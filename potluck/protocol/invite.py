"""Invites: one copy-pasteable line that tells a peer how to join a swarm and whom to trust.

Format: ``potluck:`` + base64url (unpadded) of ``msgpack([version, swarm, bootstrap, coordinator_key,
token, mqtt]) || blake2b-4(payload)``. The 4-byte checksum turns a truncated or mistyped invite into a
clear error instead of a confusing connection failure. Version 2 added ``mqtt`` (the telemetry broker's
URL, or None); version 1 invites (five fields) are still read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field

import msgpack

from potluck.protocol.errors import InviteError, ProtocolError
from potluck.protocol.identity import PUBLIC_KEY_BYTES
from potluck.protocol.keys import check_swarm_id

PREFIX = "potluck:"
VERSION = 2
READS = (1, 2)  # invite versions this build decodes
MAX_MQTT_URL_CHARS = 512
MAX_INVITE_CHARS = 8192
_CHECK_BYTES = 4


@dataclass(frozen=True)
class Invite:
    swarm_id: str
    bootstrap: tuple[str, ...]  # multiaddrs with /p2p/<peer id> of DHT nodes to join through
    coordinator_key: bytes  # Ed25519 public key that signs the job and plans
    token: str | None = field(default=None)  # optional join token (reserved for moderated swarms)
    mqtt: str | None = field(default=None)  # where peers publish telemetry: mqtt[s]://[user:pass@]host:port

    def __post_init__(self) -> None:
        try:
            check_swarm_id(self.swarm_id)
        except ProtocolError as e:
            raise InviteError(str(e)) from None
        if not self.bootstrap:
            raise InviteError("invite has no bootstrap addresses")
        for addr in self.bootstrap:
            if not (isinstance(addr, str) and addr.startswith("/") and "/p2p/" in addr and len(addr) <= 256):
                raise InviteError(f"invite bootstrap address {addr!r} is not a multiaddr ending in /p2p/<id>")
        if len(self.coordinator_key) != PUBLIC_KEY_BYTES:
            raise InviteError("invite's coordinator key is not a 32-byte Ed25519 key")
        if self.mqtt is not None and not (
            isinstance(self.mqtt, str)
            and len(self.mqtt) <= MAX_MQTT_URL_CHARS
            and self.mqtt.startswith(("mqtt://", "mqtts://"))
        ):
            raise InviteError("invite's telemetry broker is not an mqtt:// or mqtts:// URL")

    def encode(self) -> str:
        payload = msgpack.packb(
            [VERSION, self.swarm_id, list(self.bootstrap), self.coordinator_key, self.token, self.mqtt],
            use_bin_type=True,
        )
        blob = payload + _checksum(payload)
        return PREFIX + base64.urlsafe_b64encode(blob).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Invite:
        text = text.strip()
        if not text:
            raise InviteError("the invite is empty; pass the line `potluck launch` printed (or @FILE)")
        if len(text) > MAX_INVITE_CHARS:
            raise InviteError(f"the invite is too long ({len(text)} characters); it is not a potluck invite")
        if not text.startswith(PREFIX):
            raise InviteError(f"not a potluck invite: it should start with {PREFIX!r}")
        body = text[len(PREFIX) :]
        try:
            blob = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise InviteError("the invite is corrupted (not base64url); copy the whole line again") from None
        # The last character of unpadded base64 carries 2 or 4 unused bits: an altered last character can
        # decode to the same bytes. Only the canonical spelling is an invite.
        if base64.urlsafe_b64encode(blob).decode("ascii").rstrip("=") != body:
            raise InviteError(
                "the invite is truncated or altered (non-canonical ending); copy the whole line again"
            )
        payload, check = blob[:-_CHECK_BYTES], blob[-_CHECK_BYTES:]
        if len(blob) <= _CHECK_BYTES or _checksum(payload) != check:
            raise InviteError(
                "the invite is truncated or altered (checksum mismatch); copy the whole line again"
            )
        try:
            fields = msgpack.unpackb(payload, raw=False, max_bin_len=4096, max_str_len=4096, max_array_len=64)
        except Exception:
            raise InviteError("the invite's contents are malformed") from None
        if not isinstance(fields, list) or not fields:
            raise InviteError("the invite's contents are malformed")
        if fields[0] not in READS:
            raise InviteError(
                f"invite format version {fields[0]!r} is not supported (this potluck reads {READS})"
            )
        if len(fields) != 4 + fields[0]:  # version 1: five fields; 2: six
            raise InviteError("the invite's contents are malformed (wrong number of fields)")
        _, swarm_id, bootstrap, key, token, *rest = fields
        mqtt = rest[0] if rest else None
        if mqtt is not None and not isinstance(mqtt, str):
            raise InviteError("the invite's telemetry broker is malformed")
        if not (isinstance(swarm_id, str) and isinstance(bootstrap, list) and isinstance(key, bytes)):
            raise InviteError("the invite's contents are malformed (field types)")
        if token is not None and not isinstance(token, str):
            raise InviteError("the invite's token is malformed")
        return cls(swarm_id, tuple(bootstrap), key, token, mqtt)


def read_invite(arg: str) -> Invite:
    """Parse an invite given on the command line: the string itself, or ``@PATH`` to read it from a file."""
    if arg.startswith("@"):
        path = arg[1:]
        try:
            with open(path, encoding="utf-8") as f:
                arg = f.read(MAX_INVITE_CHARS + 1)
        except OSError as e:
            raise InviteError(f"cannot read invite file {path}: {e.strerror}") from None
    return Invite.decode(arg)


def _checksum(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=_CHECK_BYTES).digest()
