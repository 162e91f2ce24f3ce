"""What a hostile peer puts on the wire, built by hand as an attacker would (our encoder refuses NaN, so
an attacker does not use it): forged codec payloads and a mailbox that rewrites what it sends."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from potluck.compression import get_codec
from potluck.compression.wire import Header, Section, pack, unpack_header
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Direction, Tag

Forge = Callable[[torch.Tensor], torch.Tensor]


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
            payload = forge(payload, self.fn)
        await super().send(peer, tag, payload)
