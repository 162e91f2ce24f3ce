import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from potluck.protocol.errors import InviteError
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite, read_invite

ADDR = f"/ip4/127.0.0.1/tcp/4242/p2p/{Identity.generate().peer_id}"
INVITE = Invite("swarm-a", (ADDR,), Identity.generate().public_key, token="t0k")


def test_roundtrip_and_file(tmp_path):
    text = INVITE.encode()
    assert text.startswith("potluck:") and "\n" not in text
    assert Invite.decode(text) == INVITE
    assert Invite.decode(f"  {text}\n") == INVITE  # pasted with whitespace
    f = tmp_path / "invite.txt"
    f.write_text(text + "\n")
    assert read_invite(f"@{f}") == INVITE


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("hello world", "should start with 'potluck:'"),
        ("potluck:!!!!", "corrupted"),
        ("potluck:AAAA", "truncated or altered"),
        ("potluck:" + "A" * 9000, "too long"),
    ],
)
def test_garbage_gets_one_clear_line(text, message):
    with pytest.raises(InviteError, match=message) as err:
        Invite.decode(text)
    assert "\n" not in str(err.value)


def test_every_truncation_is_detected():
    text = INVITE.encode()
    for cut in range(len("potluck:"), len(text)):
        with pytest.raises(InviteError):
            Invite.decode(text[:cut])


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=len("potluck:"), max_value=10_000), st.sampled_from("ABCxyz019-_"))
def test_altered_character_is_detected(pos, ch):
    text = INVITE.encode()
    pos %= len(text)
    pos = max(pos, len("potluck:"))
    if text[pos] == ch:
        return
    with pytest.raises(InviteError):
        Invite.decode(text[:pos] + ch + text[pos + 1 :])


def test_missing_file_and_bad_fields(tmp_path):
    with pytest.raises(InviteError, match="cannot read invite file"):
        read_invite(f"@{tmp_path / 'nope'}")
    with pytest.raises(InviteError, match="no bootstrap"):
        Invite("swarm-a", (), b"k" * 32)
    with pytest.raises(InviteError, match="/p2p/"):
        Invite("swarm-a", ("/ip4/1.2.3.4/tcp/1",), b"k" * 32)
    with pytest.raises(InviteError, match="invalid swarm id"):
        Invite("Bad Swarm!", (ADDR,), b"k" * 32)
    with pytest.raises(InviteError, match="32-byte"):
        Invite("swarm-a", (ADDR,), b"k")


def _encode(fields):
    import base64

    import msgpack

    from potluck.protocol.invite import _checksum

    payload = msgpack.packb(fields, use_bin_type=True)
    return "potluck:" + base64.urlsafe_b64encode(payload + _checksum(payload)).decode().rstrip("=")


def test_the_telemetry_broker_travels_in_the_invite_and_version_1_is_still_read():
    with_broker = Invite("swarm-a", (ADDR,), INVITE.coordinator_key, mqtt="mqtt://127.0.0.1:1883")
    assert Invite.decode(with_broker.encode()).mqtt == "mqtt://127.0.0.1:1883"
    old = _encode([1, "swarm-a", [ADDR], INVITE.coordinator_key, "t0k"])  # what earlier builds printed
    assert Invite.decode(old) == INVITE and Invite.decode(old).mqtt is None
    with pytest.raises(InviteError, match="wrong number of fields"):
        Invite.decode(_encode([2, "swarm-a", [ADDR], INVITE.coordinator_key, "t0k"]))
    with pytest.raises(InviteError, match="not supported"):
        Invite.decode(_encode([3, "swarm-a", [ADDR], INVITE.coordinator_key, None, None, None]))
    with pytest.raises(InviteError, match="telemetry broker"):
        Invite("swarm-a", (ADDR,), INVITE.coordinator_key, mqtt="http://example.invalid/")
    with pytest.raises(InviteError, match="telemetry broker"):
        Invite.decode(_encode([2, "swarm-a", [ADDR], INVITE.coordinator_key, None, 42]))


def test_every_spelling_of_the_last_character_but_one_is_refused():
    # unpadded base64's last character has unused low bits; flipping them must not pass as the same invite
    text = INVITE.encode()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    accepted = [c for c in alphabet if _decodes(text[:-1] + c)]
    assert accepted == [text[-1]]


def _decodes(text):
    try:
        Invite.decode(text)
    except InviteError:
        return False
    return True
