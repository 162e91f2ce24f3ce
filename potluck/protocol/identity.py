"""Ed25519 identities: key files, peer ids, signing and verifying.

A potluck peer id IS the libp2p peer id of the same Ed25519 key ("12D3KooW..."), so the key that signs a
peer's DHT records is also the key its p2pd daemon authenticates streams with: a stream from peer X is
known to come from the holder of the key behind X's records, with no second mapping to trust.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from potluck.protocol.errors import IdentityError

logger = logging.getLogger(__name__)

DEFAULT_HOME = Path.home() / ".potluck"  # where key files live unless a path is given
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
# libp2p's protobuf framing of keys: field 1 (KeyType) = 1 (Ed25519), field 2 (Data) = raw bytes.
_LIBP2P_PUB_PREFIX = b"\x08\x01\x12\x20"  # Data is 32 bytes: the public key
_LIBP2P_PRIV_PREFIX = b"\x08\x01\x12\x40"  # Data is 64 bytes: seed || public key


def peer_id_from_public_key(public_key: bytes) -> str:
    """The libp2p peer id of an Ed25519 public key: base58 of an identity multihash of its protobuf."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise IdentityError(f"an Ed25519 public key has {PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    encoded = _LIBP2P_PUB_PREFIX + public_key
    # Multihash with code 0x00 (identity): keys of <= 42 bytes are inlined, not hashed.
    return base58.b58encode(b"\x00" + bytes([len(encoded)]) + encoded).decode("ascii")


def public_key_from_peer_id(peer_id: str) -> bytes:
    """The Ed25519 public key a peer id inlines (the inverse of ``peer_id_from_public_key``), so a
    signature can be checked against the id alone; ``IdentityError`` for any other kind of id."""
    header = b"\x00" + bytes([len(_LIBP2P_PUB_PREFIX) + PUBLIC_KEY_BYTES]) + _LIBP2P_PUB_PREFIX
    try:
        raw = base58.b58decode(peer_id)
    except ValueError:
        raise IdentityError(f"{peer_id!r} is not a base58 peer id") from None
    if len(raw) != len(header) + PUBLIC_KEY_BYTES or not raw.startswith(header):
        raise IdentityError(f"peer id {peer_id} does not inline an Ed25519 key")
    key = raw[len(header) :]
    if peer_id_from_public_key(key) != peer_id:
        raise IdentityError(f"peer id {peer_id} is not canonical")
    return key


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``message`` under ``public_key``."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """A private Ed25519 key with its derived public key and peer id."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)

    def libp2p_private_key(self) -> bytes:
        """The key in libp2p's protobuf format, as p2pd reads it from ``-id FILE``."""
        seed = self.private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return _LIBP2P_PRIV_PREFIX + seed + self.public_key

    # ---- files -------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path) -> Identity:
        """Load a PEM (PKCS#8) Ed25519 key, refusing files that others can read or write."""
        try:
            st = path.stat()
        except FileNotFoundError:
            raise IdentityError(f"identity file {path} does not exist") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise IdentityError(
                f"identity file {path} is accessible by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                f"a private key must be private: run `chmod 600 {path}`"
            )
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as e:
            raise IdentityError(f"identity file {path} is not a PEM private key: {e}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"identity file {path} holds a {type(key).__name__}, expected Ed25519")
        return cls(key)

    def save(self, path: Path) -> None:
        """Write the key as PEM, created with mode 0600 (never readable by others, even briefly)."""
        pem = self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        write_private(path, pem)

    @classmethod
    def load_or_create(cls, path: Path) -> Identity:
        if path.exists():
            return cls.load(path)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        identity = cls.generate()
        identity.save(path)
        logger.info("created identity %s in %s", identity.peer_id, path)
        return identity

    def write_libp2p_key(self, path: Path) -> Path:
        """Write (or refresh) the p2pd identity file derived from this key, mode 0600."""
        data = self.libp2p_private_key()
        if not (path.exists() and path.read_bytes() == data):
            write_private(path, data)
        return path


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only (mode 0600, whatever the file was before),
    atomically: a new file is written and synced, then renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
