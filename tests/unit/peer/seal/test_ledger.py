"""Step seals without a network: one signature covers a peer's step, each message stays provable on its
own, and a receiver refuses every seal that does not match what it holds."""

import asyncio

import pytest

from potluck.net.tags import Direction, Round, Stream, make_tag
from potluck.peer.errors import SealError
from potluck.peer.seal import SEAL_BYTES, Ledger, check_seal, key_of, payload_of, seal_alone
from potluck.protocol.identity import Identity

A, B, C = (Identity.generate() for _ in range(3))
STEP = Round(2, 7)
TAG = make_tag(STEP, Stream.ACTIVATIONS, chunk=1)


def tree_tag(chunk: int, step: Round = STEP) -> object:
    return make_tag(step.bucket(0), Stream.TREE, index=1, chunk=chunk, direction=Direction.REDUCE)


class CountingIdentity:
    """An identity that counts its signatures."""

    def __init__(self, inner: Identity) -> None:
        self.inner, self.peer_id, self.signed = inner, inner.peer_id, 0

    def sign(self, message: bytes) -> bytes:
        self.signed += 1
        return self.inner.sign(message)


def a_step() -> tuple[CountingIdentity, Ledger, dict[str, bytes]]:
    """A sends B three messages and C two, and keeps its own row: one step, sealed."""
    me = CountingIdentity(A)
    ledger = Ledger(me)  # type: ignore[arg-type]
    for c in range(3):
        ledger.note(B.peer_id, tree_tag(c), f"to B {c}".encode())
    for c in range(2):
        ledger.note(C.peer_id, tree_tag(c), f"to C {c}".encode())
    ledger.note(A.peer_id, tree_tag(0), b"own row")
    return me, ledger, ledger.close(STEP)


def test_one_signature_seals_a_whole_step_and_each_message_stays_provable_alone():
    me, sender, seals = a_step()
    assert me.signed == 1
    assert sorted(seals) == sorted([B.peer_id, C.peer_id])  # nothing goes to itself
    b = Ledger(B)
    for c in range(3):
        assert b.hold(A.peer_id, tree_tag(c), f"to B {c}".encode()) == f"to B {c}".encode()
    assert b.awaiting(STEP) == [A.peer_id]
    assert b.accept(A.peer_id, STEP, seals[B.peer_id]) == 3
    assert b.awaiting(STEP) == []
    for c in range(3):
        evidence = b.received[(A.peer_id, key_of(tree_tag(c)))]
        assert check_seal(A.peer_id, B.peer_id, tree_tag(c), evidence) == f"to B {c}".encode()
        assert b.payload(A.peer_id, tree_tag(c)) == f"to B {c}".encode()
        with pytest.raises(SealError):  # bound to its link and its chunk
            check_seal(A.peer_id, C.peer_id, tree_tag(c), evidence)
        with pytest.raises(SealError):
            check_seal(A.peer_id, B.peer_id, tree_tag((c + 1) % 3), evidence)
    own = sender.sent[(A.peer_id, key_of(tree_tag(0)))]
    assert check_seal(A.peer_id, A.peer_id, tree_tag(0), own) == b"own row"  # what an auditor checks
    assert payload_of(own) == b"own row"


def test_a_receiver_checks_only_what_it_holds():
    _, _, seals = a_step()
    c = Ledger(C)
    c.hold(A.peer_id, tree_tag(1), b"to C 1")  # chunk 0 never came: nothing to prove
    assert c.accept(A.peer_id, STEP, seals[C.peer_id]) == 1


@pytest.mark.parametrize(
    "case",
    ["altered payload", "left out", "bad signature", "truncated", "another sender", "another step"],
)
def test_a_step_seal_that_does_not_match_what_came_is_refused_naming_its_sender(case: str):
    _, _, seals = a_step()
    seal, sender, step = seals[B.peer_id], A.peer_id, STEP
    b = Ledger(B)
    for c in range(3):
        b.hold(A.peer_id, tree_tag(c), f"to B {c}".encode())
    if case == "altered payload":  # what came is not what the seal signs
        b.hold(A.peer_id, tree_tag(2), b"to B 2, changed")
    elif case == "left out":  # a message the seal does not cover
        b.hold(A.peer_id, tree_tag(3), b"to B 3")
    elif case == "bad signature":
        seal = seal[:40] + bytes([seal[40] ^ 1]) + seal[41:]
    elif case == "truncated":
        seal = seal[:-5]
    elif case == "another sender":  # C's ledger asked to take A's seal as C's
        b.hold(C.peer_id, tree_tag(0), b"to B 0")
        sender = C.peer_id
    elif case == "another step":
        b.hold(A.peer_id, tree_tag(0, Round(2, 8)), b"later")
        step = Round(2, 8)
    with pytest.raises(SealError) as e:
        b.accept(sender, step, seal)
    assert e.value.peer == sender


def test_a_message_sealed_alone_binds_sender_receiver_tag_and_payload():
    sealed = seal_alone(A, B.peer_id, TAG, b"payload")
    assert len(sealed) == len(b"payload") + SEAL_BYTES
    receiver = Ledger(B)

    async def opened() -> bytes:
        payload = receiver.open_later(A.peer_id, TAG, sealed)
        await receiver.settle()
        return payload

    assert asyncio.run(opened()) == b"payload"
    assert receiver.received[(A.peer_id, key_of(TAG))] == sealed  # kept as evidence
    other_tag = make_tag(STEP, Stream.ACTIVATIONS, chunk=2)
    for sender, to, tag, data in [
        (A.peer_id, B.peer_id, TAG, b"Payload" + sealed[7:]),  # altered payload
        (A.peer_id, C.peer_id, TAG, sealed),  # moved to another link
        (A.peer_id, B.peer_id, other_tag, sealed),  # moved to another micro-batch
        (C.peer_id, B.peer_id, TAG, sealed),  # claimed for another sender
        (A.peer_id, B.peer_id, TAG, sealed[:10]),  # shorter than a seal
        (A.peer_id, B.peer_id, TAG, sealed[:-SEAL_BYTES] + b"\0" * SEAL_BYTES),  # no leaves
        ("QmNotAnEd25519Id", B.peer_id, TAG, sealed),
    ]:
        with pytest.raises(SealError):
            check_seal(sender, to, tag, data)


def test_the_ledger_forgets_finished_steps_sealed_or_not():
    ledger = Ledger(A)
    ledger.note(B.peer_id, TAG, b"x")
    ledger.close(STEP)
    later = make_tag(Round(2, 8), Stream.ACTIVATIONS)
    ledger.note(B.peer_id, later, b"y")
    ledger.hold(C.peer_id, TAG, b"z")
    ledger.forget(Round(2, 8).pack())
    assert list(ledger.sent) == [] and ledger.awaiting(STEP) == []
    assert sorted(ledger.close(Round(2, 8))) == [B.peer_id]
