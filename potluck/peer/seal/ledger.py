"""Sealed messages: one signature per peer and step commits it to everything it sent in that step.

A receiver must be able to show a third party exactly what a peer sent it: the pipeline spot checks
(``train/checks/spot.py``) replay what a neighbour sent, the audits (``train/checks/audit.py``) redo a
shard owner's aggregation from the rows it received. So every message a checked step carries is sealed
by its author, and the seal binds the sender, the receiver, the message's tag (plan epoch, step, stream,
chunk, direction) and a hash of its payload: evidence can be neither forged nor moved to another link,
step or chunk.

One signature per message cost 10 Ed25519 signatures and 9 verifications per peer and step on the
Byzantine benchmark's 10 replicas (~2.6 ms of a peer's step on this machine; a verification is ~210 us
here). Instead messages travel bare, and when a peer's step is done it signs once, over the Merkle root
(``merkle.py``) of every message it sent in that step (``close``), and sends each receiver the root, the
signature and the proofs of that receiver's messages: one short message per link and step. The receiver
checks the signature once per sender (``accept``) and turns each message it holds into self-contained
evidence: payload, proof, leaf index, leaf count and signature (``attach``; ``check_seal`` checks one).
Bare messages are only ever used inside the step: the step's READY waits for the seals
(``exchange.py``), so a sender that seals badly, or not at all, fails the step naming itself, exactly as
a bad per-message seal did, and nobody can dodge a later check by sending unprovable bytes.

Each peer keeps the messages of the step in flight (its ``Ledger``) until the step is committed and the
checks it holds evidence for are served; then they are dropped.
"""

from __future__ import annotations

import asyncio
import functools
import struct

from potluck.net.tags import TAG_BYTES, Round, Tag
from potluck.peer.errors import SealError
from potluck.peer.seal import merkle
from potluck.protocol.errors import IdentityError
from potluck.protocol.identity import SIGNATURE_BYTES, Identity, public_key_from_peer_id, verify

_DOMAIN = b"potluck/step-seal/2\0"
_PLACE = struct.Struct("<II")  # a leaf's index, the tree's leaf count
_HEAD = struct.Struct("<32s64sII")  # a step seal: root, signature, leaf count, entries for this receiver
_ENTRY = struct.Struct(f"<{TAG_BYTES}sI")  # one entry: the message's tag, its leaf index; then its proof
SEAL_BYTES = _PLACE.size + SIGNATURE_BYTES  # a seal's bytes beyond the payload and its proof

Key = tuple[int, int, int, int]  # (packed round, stream, chunk, direction) of one message


def key_of(tag: Tag) -> Key:
    return (tag.round, tag.stream, tag.chunk, tag.direction)


def _in_step(key: Key, rnd: Round) -> bool:
    return Round(rnd.epoch, rnd.step).pack() <= key[0] < Round(rnd.epoch, rnd.step + 1).pack()


def leaf_of(sender: str, receiver: str, tag: Tag, payload: bytes) -> bytes:
    """The Merkle leaf of one message: who sent it to whom, under which tag, with which payload."""
    parts = [sender.encode(), b"\0", receiver.encode(), b"\0", tag.pack(), merkle.digest(payload)]
    return merkle.leaf(b"".join(parts))


def root_message(sender: str, root: bytes) -> bytes:
    """The bytes a step seal signs (never sent: both ends rebuild them)."""
    return b"".join([_DOMAIN, sender.encode(), b"\0", root])


def attach(payload: bytes, proof: list[bytes], index: int, count: int, signature: bytes) -> bytes:
    """One message as evidence on its own: payload, proof, leaf index and count, the root's signature."""
    return b"".join([payload, *proof, _PLACE.pack(index, count), signature])


def _split(sealed: bytes) -> tuple[bytes, list[bytes], int, int, bytes]:
    """(payload, proof, index, count, signature) of an ``attach``ed message; ValueError if malformed."""
    if len(sealed) < SEAL_BYTES:
        raise ValueError(f"shorter than a seal ({len(sealed)} bytes)")
    signature = sealed[-SIGNATURE_BYTES:]
    index, count = _PLACE.unpack_from(sealed, len(sealed) - SEAL_BYTES)
    n = merkle.depth(count) * merkle.DIGEST_BYTES
    end = len(sealed) - SEAL_BYTES - n
    if end < 0:
        raise ValueError(f"shorter than its seal's proof ({len(sealed)} bytes)")
    return sealed[:end], _hashes(sealed[end : len(sealed) - SEAL_BYTES]), index, count, signature


def _hashes(body: bytes) -> list[bytes]:
    """A proof's sibling hashes, as they lie one after another."""
    return [body[i : i + merkle.DIGEST_BYTES] for i in range(0, len(body), merkle.DIGEST_BYTES)]


def payload_of(sealed: bytes) -> bytes:
    """The payload of an ``attach``ed message, unchecked (for what this peer itself holds)."""
    try:
        return _split(sealed)[0]
    except ValueError as e:
        raise SealError("", f"not a sealed message: {e}") from None


@functools.lru_cache(maxsize=4096)
def _public_key(peer_id: str) -> bytes:
    return public_key_from_peer_id(peer_id)


def _check_root(sender: str, root: bytes, signature: bytes, what: str) -> None:
    try:
        key = _public_key(sender)
    except IdentityError as e:
        raise SealError(sender, f"cannot check the seal of {sender}: {e}") from None
    if not verify(key, root_message(sender, root), signature):
        raise SealError(sender, f"{what} from {sender} carries a bad seal")


def _unsealed(sender: str, receiver: str, tag: Tag, sealed: bytes) -> tuple[bytes, bytes, bytes]:
    """(payload, the root its proof reaches, the signature) of ``sealed``; SealError if malformed."""
    try:
        payload, proof, index, count, signature = _split(sealed)
        root = merkle.climb(leaf_of(sender, receiver, tag, payload), index, count, proof)
    except ValueError as e:
        raise SealError(sender, f"{tag} from {sender}: {e}") from None
    return payload, root, signature


def check_seal(sender: str, receiver: str, tag: Tag, sealed: bytes) -> bytes:
    """The payload of ``sealed`` if ``sender`` sealed it for ``receiver`` under ``tag``; else SealError."""
    payload, root, signature = _unsealed(sender, receiver, tag, sealed)
    _check_root(sender, root, signature, str(tag))
    return payload


def seal_alone(identity: Identity, receiver: str, tag: Tag, payload: bytes) -> bytes:
    """One message sealed by itself (a one-leaf tree): what tests and attack harnesses forge with."""
    root = leaf_of(identity.peer_id, receiver, tag, payload)
    return attach(payload, [], 0, 1, identity.sign(root_message(identity.peer_id, root)))


class Ledger:
    """This peer's messages of the steps not yet forgotten, sent and received: (the peer it was sent to
    or came from, the message's key) -> the message as evidence once sealed (``attach``), else bare."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.peer_id = identity.peer_id
        self.sent: dict[tuple[str, Key], bytes] = {}  # sealed by this peer's step seal
        self.received: dict[tuple[str, Key], bytes] = {}  # sealed by their senders, or kept as received
        self._outbox: dict[tuple[str, Key], tuple[Tag, bytes]] = {}  # sent, not sealed yet
        self._inbox: dict[tuple[str, Key], tuple[Tag, bytes]] = {}  # received, its seal not checked yet
        self._checked: set[tuple[str, bytes, bytes]] = set()  # (sender, root, signature) found good
        self._pending: list[asyncio.Future[bytes]] = []  # seal checks on worker threads (open_later)

    def note(self, receiver: str, tag: Tag, payload: bytes) -> bytes:
        """Record a message this peer sends (``receiver`` may be itself: its own row, for the auditors);
        the step seal will cover it. Returns the payload, to send bare. A second note of the same message
        replaces the first: the seal covers what went out last."""
        self._outbox[(receiver, key_of(tag))] = (tag, payload)
        return payload

    def hold(self, sender: str, tag: Tag, payload: bytes) -> bytes:
        """Record a bare message from ``sender``, to be matched with its step seal; returns the payload."""
        self._inbox[(sender, key_of(tag))] = (tag, payload)
        return payload

    def seal_together(self, messages: list[tuple[str, Tag, bytes]]) -> list[bytes]:
        """Seal ``messages`` (receiver, tag, payload) made together with one signature; each comes back
        with its seal attached, to go out as it is, and is kept as evidence in ``sent``."""
        self._sign(messages)
        return [self.sent[(receiver, key_of(tag))] for receiver, tag, _ in messages]

    def _sign(self, messages: list[tuple[str, Tag, bytes]]) -> tuple[bytes, bytes, list[list[bytes]]]:
        """One signature over the Merkle root of ``messages``, each kept in ``sent`` as evidence:
        (root, signature, each message's proof)."""
        tree = merkle.levels([leaf_of(self.peer_id, r, tag, payload) for r, tag, payload in messages])
        root = tree[-1][0]
        signature = self.identity.sign(root_message(self.peer_id, root))
        proofs = [merkle.proof(tree, i) for i in range(len(messages))]
        for i, (receiver, tag, payload) in enumerate(messages):
            self.sent[(receiver, key_of(tag))] = attach(payload, proofs[i], i, len(messages), signature)
        return root, signature, proofs

    def open_later(self, sender: str, tag: Tag, sealed: bytes) -> bytes:
        """The payload of a message with its seal attached, kept as evidence; the seal is checked on a
        worker thread and ``settle`` waits for the check (a seal already checked, another message of the
        same batch, costs a proof, not a signature check). Hashing and Ed25519 release the GIL, so the
        check costs the event loop nothing (a verification is ~210 us here: 9 per shard owner and round
        on 10 replicas). SealError now only if ``sealed`` cannot be a sealed message at all."""
        try:
            payload = _split(sealed)[0]
        except ValueError as e:
            raise SealError(sender, f"{tag} from {sender}: {e}") from None
        self.received[(sender, key_of(tag))] = sealed
        loop = asyncio.get_running_loop()
        self._pending.append(loop.run_in_executor(None, self._check, sender, tag, sealed))
        return payload

    async def settle(self) -> None:
        """Wait for every check ``open_later`` started; SealError naming the sender of a bad seal."""
        pending, self._pending = self._pending, []
        for outcome in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome

    def _check(self, sender: str, tag: Tag, sealed: bytes) -> bytes:
        payload, root, signature = _unsealed(sender, self.peer_id, tag, sealed)
        if (sender, root, signature) not in self._checked:
            _check_root(sender, root, signature, str(tag))
            self._checked.add((sender, root, signature))
        return payload

    def keep(self, sender: str, tag: Tag, data: bytes) -> None:
        """Keep an unsealed message as received (what this peer itself testifies to)."""
        self.received[(sender, key_of(tag))] = data

    def payload(self, sender: str, tag: Tag) -> bytes | None:
        """What ``sender`` sent this peer under ``tag``, sealed or not yet; None if nothing."""
        held = self._inbox.get((sender, key_of(tag)))
        if held is not None:
            return held[1]
        sealed = self.received.get((sender, key_of(tag)))
        return None if sealed is None else payload_of(sealed)

    def awaiting(self, rnd: Round) -> list[str]:
        """The peers whose step seal this peer needs for step ``rnd``: it holds their bare messages."""
        return sorted({sender for sender, key in self._inbox if _in_step(key, rnd)})

    def close(self, rnd: Round) -> dict[str, bytes]:
        """Seal every message this peer sent in step ``rnd``: one signature over their Merkle root. Returns
        the step seal for each receiver (``accept`` reads it); the messages become evidence in ``sent``."""
        mine = sorted(entry for entry in self._outbox if _in_step(entry[1], rnd))
        if not mine:
            return {}
        messages = [(receiver, *self._outbox.pop((receiver, key))) for receiver, key in mine]
        root, signature, proofs = self._sign(messages)
        entries: dict[str, list[bytes]] = {}
        for i, (receiver, tag, _) in enumerate(messages):
            if receiver != self.peer_id:
                entries.setdefault(receiver, []).append(_ENTRY.pack(tag.pack(), i) + b"".join(proofs[i]))
        return {
            receiver: _HEAD.pack(root, signature, len(messages), len(parts)) + b"".join(parts)
            for receiver, parts in entries.items()
        }

    def accept(self, sender: str, rnd: Round, message: bytes) -> int:
        """Check ``sender``'s step seal for step ``rnd`` against the bare messages held from it; each
        becomes evidence in ``received``. SealError if the seal is malformed or badly signed, or misses
        or mismatches a held message. Returns how many messages it sealed."""
        try:
            root, signature, count, n = _HEAD.unpack_from(message)
            size = _ENTRY.size + merkle.depth(count) * merkle.DIGEST_BYTES
        except (struct.error, ValueError) as e:
            raise SealError(sender, f"malformed step seal from {sender}: {e}") from None
        if n > count or len(message) != _HEAD.size + n * size:
            raise SealError(sender, f"malformed step seal from {sender}: {n} entries, {len(message)} bytes")
        _check_root(sender, root, signature, f"the step seal of step {rnd.step}")
        sealed = 0
        for at in range(_HEAD.size, len(message), size):
            raw, index = _ENTRY.unpack_from(message, at)
            proof = _hashes(message[at + _ENTRY.size : at + size])
            tag = Tag.unpack(raw)
            held = self._inbox.get((sender, key_of(tag)))
            if held is None or not _in_step(key_of(tag), rnd):
                continue  # a message this peer never used: nothing to prove
            try:
                reached = merkle.climb(leaf_of(sender, self.peer_id, tag, held[1]), index, count, proof)
            except ValueError as e:
                raise SealError(sender, f"{tag} from {sender}: {e}") from None
            if reached != root:
                raise SealError(sender, f"{tag} from {sender} is not what its step seal signs")
            del self._inbox[(sender, key_of(tag))]
            self.received[(sender, key_of(tag))] = attach(held[1], proof, index, count, signature)
            sealed += 1
        left = [key for s, key in self._inbox if s == sender and _in_step(key, rnd)]
        if left:
            raise SealError(sender, f"the step seal of {sender} leaves {len(left)} of its messages unsealed")
        return sealed

    def forget(self, before_round: int) -> None:
        """Drop the messages of every round before ``before_round`` (a packed Round)."""
        for book in (self.sent, self.received, self._outbox, self._inbox):
            for entry in [e for e in book if e[1][0] < before_round]:
                del book[entry]
        self._checked.clear()  # a batch's messages arrive within one round
        for check in self._pending:  # an aborted step's: nobody waits for them now
            check.add_done_callback(_ignore)
        self._pending = []


def _ignore(check: asyncio.Future[bytes]) -> None:
    if not check.cancelled():
        check.exception()  # retrieved, so that asyncio does not log it as never retrieved
