import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from potluck.protocol.errors import IdentityError
from potluck.protocol.identity import Identity, peer_id_from_public_key, verify


def test_save_load_roundtrip_with_private_mode(tmp_path):
    path = tmp_path / "sub" / "id.pem"
    ident = Identity.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Identity.load_or_create(path)
    assert again.peer_id == ident.peer_id
    assert again.public_key == ident.public_key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_refuses_key_readable_by_others(tmp_path, mode):
    path = tmp_path / "id.pem"
    Identity.generate().save(path)
    os.chmod(path, mode)
    with pytest.raises(IdentityError, match="chmod 600"):
        Identity.load(path)


def test_refuses_garbage_and_foreign_key_types(tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a key")
    os.chmod(garbage, 0o600)
    with pytest.raises(IdentityError, match="not a PEM private key"):
        Identity.load(garbage)
    ecfile = tmp_path / "ec.pem"
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    ecfile.write_bytes(pem)
    os.chmod(ecfile, 0o600)
    with pytest.raises(IdentityError, match="expected Ed25519"):
        Identity.load(ecfile)
    with pytest.raises(IdentityError, match="does not exist"):
        Identity.load(tmp_path / "missing.pem")


def test_peer_id_is_a_libp2p_ed25519_id():
    ident = Identity.generate()
    assert ident.peer_id.startswith("12D3KooW")
    assert ident.peer_id == peer_id_from_public_key(ident.public_key)
    assert Identity.generate().peer_id != ident.peer_id
    with pytest.raises(IdentityError):
        peer_id_from_public_key(b"short")


def test_sign_and_verify():
    ident, other = Identity.generate(), Identity.generate()
    sig = ident.sign(b"hello")
    assert verify(ident.public_key, b"hello", sig)
    assert not verify(ident.public_key, b"hello!", sig)
    assert not verify(other.public_key, b"hello", sig)
    assert not verify(ident.public_key, b"hello", sig[:-1])


def test_libp2p_key_file_is_private_and_stable(tmp_path):
    ident = Identity.generate()
    path = ident.write_libp2p_key(tmp_path / "k.p2pkey")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = path.read_bytes()
    assert len(data) == 4 + 64 and data.endswith(ident.public_key)


def test_a_private_text_replaces_a_file_others_could_read(tmp_path):
    """The CLI writes invites (they may carry a join token) through the same private writer as keys:
    a file that was world-readable before ends up readable by its owner only."""
    from potluck.cli.common import write_private_text

    invite = tmp_path / "sub" / "invite.txt"
    invite.parent.mkdir()
    invite.write_text("old")
    os.chmod(invite, 0o644)
    write_private_text(invite, "potluck:new")
    assert invite.read_text() == "potluck:new\n"
    assert stat.S_IMODE(invite.stat().st_mode) == 0o600
    assert [p.name for p in invite.parent.iterdir()] == ["invite.txt"]  # no temporary file left
