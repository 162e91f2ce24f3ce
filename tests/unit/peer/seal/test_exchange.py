"""The step-seal exchange over an in-memory mailbox, all-reduce batches under one signature, and seal
checks on worker threads that the step waits for."""

from __future__ import annotations

import asyncio

import pytest

from potluck.net.tags import Direction, Round, Stream, Tag, make_tag
from potluck.peer.errors import SealError
from potluck.peer.seal import Batches, Ledger, check_seal, check_seals, deliver_seals, key_of
from potluck.protocol.errors import WireError
from potluck.protocol.identity import Identity

A, B = Identity.generate(), Identity.generate()
STEP = Round(3, 5)


class MemBox:
    """Just what the exchange uses of a Mailbox: send (quietly) and recv by (sender, receiver, tag)."""

    def __init__(self, me: str, wires: dict[tuple[str, str, Tag], asyncio.Future[bytes]]) -> None:
        self.peer_id, self.wires = me, wires

    def _wire(self, src: str, dst: str, tag: Tag) -> asyncio.Future[bytes]:
        return self.wires.setdefault((src, dst, tag), asyncio.get_running_loop().create_future())

    async def send_quietly(self, peer: str, tag: Tag, payload: bytes) -> str | None:
        self._wire(self.peer_id, peer, tag).set_result(payload)
        return None

    async def recv(self, peer: str, tag: Tag, timeout_s: float | None = None) -> bytes:
        try:
            return await asyncio.wait_for(asyncio.shield(self._wire(peer, self.peer_id, tag)), timeout_s)
        except TimeoutError:
            raise WireError(f"no message {tag} from {peer} within {timeout_s} s") from None


def acts(m: int) -> Tag:
    return make_tag(STEP, Stream.ACTIVATIONS, chunk=m)


def grads(m: int) -> Tag:
    return make_tag(STEP, Stream.ACTIVATION_GRADS, chunk=m)


async def exchange(box: MemBox, ledger: Ledger, check: bool) -> None:
    """What ``Duties.seal`` does: its own seals out, then (``check``) its senders' checked."""
    await deliver_seals(box, STEP, ledger.close(STEP))  # type: ignore[arg-type]
    if check:
        await check_seals(box, ledger, STEP, 0.2)  # type: ignore[arg-type]


def pipeline(
    withhold: bool = False, failed: bool = False
) -> tuple[Ledger, Ledger, list[BaseException | None]]:
    """Stage 0 (A) sends B four micro-batches' activations, B sends back their gradients; both seal."""
    a, b = Ledger(A), Ledger(B)
    for m in range(4):
        b.hold(A.peer_id, acts(m), a.note(B.peer_id, acts(m), f"acts {m}".encode()))
        a.hold(B.peer_id, grads(m), b.note(A.peer_id, grads(m), f"grads {m}".encode()))

    async def run() -> list[BaseException | None]:
        wires: dict = {}
        box_a, box_b = MemBox(A.peer_id, wires), MemBox(B.peer_id, wires)
        b_side = exchange(box_b, b, check=True)
        # a failed replica seals what it sent and checks nothing; a withholding one sends nothing
        a_side = asyncio.sleep(0) if withhold else exchange(box_a, a, check=not failed)
        return await asyncio.gather(a_side, b_side, return_exceptions=True)

    return a, b, asyncio.run(run())


def test_neighbours_exchange_one_seal_each_and_hold_evidence_for_every_message():
    a, b, outcome = pipeline()
    assert outcome == [None, None]
    for m in range(4):
        assert check_seal(A.peer_id, B.peer_id, acts(m), b.received[(A.peer_id, key_of(acts(m)))])
        assert check_seal(B.peer_id, A.peer_id, grads(m), a.received[(B.peer_id, key_of(grads(m)))])
    signatures = {v[-64:] for v in b.received.values()}
    assert len(signatures) == 1  # one signature over A's whole step


def test_a_replica_whose_step_failed_still_seals_so_its_neighbour_need_not_wait_out_its_timeout():
    _, b, outcome = pipeline(failed=True)
    assert outcome == [None, None] and len(b.received) == 4


def test_a_withheld_step_seal_fails_the_step_naming_its_sender():
    _, _, outcome = pipeline(withhold=True)
    assert isinstance(outcome[1], SealError) and outcome[1].peer == A.peer_id


def reduce_tag(tree: int) -> Tag:
    return make_tag(STEP.bucket(0), Stream.TREE, index=tree, chunk=0, direction=Direction.REDUCE)


def test_a_batch_waits_for_all_its_messages_then_seals_them_with_one_signature():
    owners = [Identity.generate().peer_id for _ in range(2)]

    async def run() -> list[bytes]:
        batches = Batches(Ledger(A), 3)
        first = batches.add(0, owners[0], reduce_tag(0), b"row for 0")
        own = batches.add(0, A.peer_id, reduce_tag(1), b"own row")
        await asyncio.sleep(0)
        assert not first.done() and not own.done()  # one message short
        last = await batches.seal(0, owners[1], reduce_tag(2), b"row for 2")
        return [first.result(), own.result(), last]

    sealed = asyncio.run(run())
    receivers = [owners[0], A.peer_id, owners[1]]
    for i, (to, blob) in enumerate(zip(receivers, sealed, strict=True)):
        assert check_seal(A.peer_id, to, reduce_tag(i), blob) == [b"row for 0", b"own row", b"row for 2"][i]
    assert len({blob[-64:] for blob in sealed}) == 1


def test_seals_checked_on_worker_threads_are_waited_for_and_name_a_bad_sender():
    async def run(tamper: bool) -> Ledger:
        sealed = Ledger(A).seal_together([(B.peer_id, reduce_tag(t), f"row {t}".encode()) for t in range(3)])
        if tamper:  # a flipped bit of the signature: every message of the batch now fails
            sealed[2] = sealed[2][:-1] + bytes([sealed[2][-1] ^ 1])
        owner = Ledger(B)
        for t, blob in enumerate(sealed):
            assert owner.open_later(A.peer_id, reduce_tag(t), blob) == f"row {t}".encode()
        await owner.settle()
        return owner

    owner = asyncio.run(run(tamper=False))
    assert len(owner.received) == 3
    with pytest.raises(SealError) as e:
        asyncio.run(run(tamper=True))
    assert e.value.peer == A.peer_id
