"""What a hostile peer puts on the wire, built by hand as an attacker would (our encoder refuses NaN, so
an attacker does not use it): forged codec payloads and a mailbox that rewrites what it sends."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import numpy as np
import torch

from potluck.compression import get_codec
from potluck.compression.wire import Header, Section, pack, unpack_header
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Direction, Tag
from potluck.peer.errors import SealError
from potluck.peer.seal import check_seal, seal_alone

Forge = Callable[[torch.Tensor], torch.Tensor]


def inside_seal(box: Mailbox, peer: str, tag: Tag, payload: bytes) -> tuple[bytes, bool]:
    """(the payload inside ``box``'s own seal, True) for a sealed message, else (payload, False)."""
    if getattr(box, "identity", None) is None:
        return payload, False
    try:
        return check_seal(box.peer_id, peer, tag, payload), True
    except SealError:
        return payload, False


def rewritten(box: Mailbox, peer: str, tag: Tag, payload: bytes, fn: Callable[[bytes], bytes]) -> bytes:
    """``fn`` applied to what ``box`` sends, inside its seal and sealed again with the sender's own key:
    any peer can sign whatever it sends (``box.identity``, set by ``train_swarm``)."""
    inner, sealed = inside_seal(box, peer, tag, payload)
    if not sealed:
        return fn(payload)
    return seal_alone(box.identity, peer, tag, fn(inner))  # type: ignore[attr-defined]


def raw_payload(tensor: torch.Tensor, spec: str = "none") -> bytes:
    """A well-formed payload of codec ``spec`` (raw fp32 values) holding ``tensor`` as is, NaN or not."""
    t = tensor.detach().to(torch.float32).contiguous()
    section = Section(np.frombuffer(t.numpy().tobytes(), dtype=np.uint8), 4)
    return pack(Header(torch.float32, tuple(t.shape), spec, None, 0), [section])


def forge(payload: bytes, fn: Forge) -> bytes:
    """``payload`` with its tensor replaced by ``fn(tensor)``, under the same codec; values the encoder
    would refuse (NaN, Inf) are written raw, which is valid only for the raw codec ``none``."""
    header, _ = unpack_header(payload)
    x = fn(get_codec(header.spec).decode(payload))
    if bool(torch.isfinite(x).all()):
        return get_codec(header.spec).encode(x.to(header.dtype), key=header.key)
    if header.spec != "none":
        raise ValueError(f"cannot write NaN/Inf into a {header.spec!r} payload by hand here")
    return raw_payload(x)


class HostileMailbox(Mailbox):
    """A mailbox that rewrites the all-reduce contributions it sends (the REDUCE direction) with ``fn``;
    everything else (broadcasts, pipeline, control) goes out as the honest code made it."""

    def __init__(self, *args, fn: Forge, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.fn = fn

    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        if tag.direction == Direction.REDUCE:
            payload = rewritten(self, peer, tag, payload, lambda p: forge(p, self.fn))
        await super().send(peer, tag, payload)


class Oracle:
    """What an omniscient attacker knows: every honest replica's contribution under each tag (the
    strongest threat model of the robust-aggregation papers). Honest ``SpyMailbox``es deposit, the
    attackers' ``OracleMailbox``es read."""

    def __init__(self, honest: int) -> None:
        self.honest = honest  # honest senders of each tag (the shard owner's own row is never sent)
        self.seen: dict[tuple[int, int, int], list[torch.Tensor]] = {}
        self.changed = asyncio.Event()

    def deposit(self, tag: Tag, payload: bytes) -> None:
        header, _ = unpack_header(payload)
        self.seen.setdefault((tag.round, tag.stream, tag.chunk), []).append(
            get_codec(header.spec).decode(payload)
        )
        self.changed.set()

    async def honest_rows(self, tag: Tag, wait_s: float = 5.0) -> torch.Tensor | None:
        key = (tag.round, tag.stream, tag.chunk)
        deadline = asyncio.get_running_loop().time() + wait_s
        while len(self.seen.get(key, [])) < self.honest:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                break
        rows = self.seen.get(key)
        return torch.stack(rows) if rows else None


class SpyMailbox(Mailbox):
    """An honest mailbox whose all-reduce contributions the oracle learns (the attackers' view)."""

    def __init__(self, *args, oracle: Oracle, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.oracle = oracle

    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        if tag.direction == Direction.REDUCE:
            self.oracle.deposit(tag, inside_seal(self, peer, tag, payload)[0])
        await super().send(peer, tag, payload)


class OracleMailbox(Mailbox):
    """A colluding attacker's mailbox: ``fn(own, honest_rows)`` makes each contribution it sends."""

    def __init__(  # type: ignore[no-untyped-def]
        self, *args, oracle: Oracle, fn: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor], **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.oracle, self.fn = oracle, fn

    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        if tag.direction == Direction.REDUCE:
            rows = await self.oracle.honest_rows(tag)
            payload = rewritten(self, peer, tag, payload, lambda p: forge(p, lambda own: self.fn(own, rows)))
        await super().send(peer, tag, payload)


def little_is_enough(z: float) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """Baruch et al. (2019): every attacker sends mean - z x std of the honest contributions, per
    coordinate: inside the honest spread, so no outlier test sees it, yet all attackers pull one way."""

    def attack(own: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        if rows is None or rows.shape[0] < 2:
            return own
        return rows.mean(0) - z * rows.std(0)

    return attack


def alie_z(n: int, attackers: int) -> float:
    """The largest z that stays hidden for n workers and m attackers (Baruch et al., eq. 2 and 3)."""
    s = math.floor(n / 2 + 1) - attackers
    p = (n - s) / n
    return float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(min(max(p, 0.5), 0.999))))
