"""What spot checks and audits share: the draw from a committed step, evidence framing, the comparison
of what a peer sent with a recomputation, and the background tasks that push and check evidence."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import struct
from collections.abc import Coroutine
from typing import Any

import torch

from potluck.compression import Codec
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Tag
from potluck.peer.train.commit import Decision

logger = logging.getLogger(__name__)

MAX_CHECKERS = 2  # replicas recomputing each checked piece of work
_COUNT, _LEN = struct.Struct("<B"), struct.Struct("<I")


def check_seed(job: str, rnd: Round, decision: Decision) -> bytes:
    """What every peer of the plan draws step ``rnd``'s checks from: its committed decision."""
    text = f"{job}|{rnd.pack()}|{decision.norms!r}|{decision.loss!r}"
    return hashlib.blake2b(text.encode(), digest_size=32).digest()


def uniform(seed: bytes, *parts: int) -> float:
    """A number in [0, 1) every peer draws alike from ``seed`` and ``parts``."""
    digest = hashlib.blake2b(seed + struct.pack(f"<{len(parts)}Q", *parts), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def pack_evidence(blobs: list[bytes]) -> bytes:
    return _COUNT.pack(len(blobs)) + b"".join(_LEN.pack(len(b)) + b for b in blobs)


def unpack_evidence(data: bytes, count: int) -> list[bytes]:
    """``count`` length-prefixed pieces, every length checked against what is there; else ValueError."""
    if len(data) < _COUNT.size or _COUNT.unpack_from(data)[0] != count:
        raise ValueError(f"evidence must hold {count} pieces")
    out, at = [], _COUNT.size
    for _ in range(count):
        if at + _LEN.size > len(data):
            raise ValueError("evidence truncated")
        (n,) = _LEN.unpack_from(data, at)
        at += _LEN.size
        if at + n > len(data):
            raise ValueError("evidence piece longer than the message")
        out.append(data[at : at + n])
        at += n
    if at != len(data):
        raise ValueError("trailing bytes after the evidence")
    return out


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12))


def mismatch(
    sent: torch.Tensor, recomputed: torch.Tensor, codec: Codec, tolerance: float, codings: int = 2
) -> float | None:
    """The relative L2 error of what a peer sent against the recomputation, if more than the codec's own
    error (``codings`` x what it loses coding the recomputed tensor: 2 by default, a margin over the one
    coding a message has) plus ``tolerance`` explain; else None."""
    if sent.shape != recomputed.shape:
        return math.inf
    coded = codec.decode(codec.encode(recomputed.detach().float().cpu().contiguous()))
    allowed = tolerance + codings * relative_error(coded, recomputed.cpu())
    err = relative_error(sent.cpu(), recomputed.cpu())
    return err if err > allowed else None


class Duty:
    """Background work of a trainer's checks: evidence sends and checks, cancelled with the run."""

    def __init__(self, box: Mailbox) -> None:
        self.box = box
        self.tasks: set[asyncio.Task[None]] = set()
        self.crashed = 0  # background tasks that ended with an error (each logged)

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.crashed += 1
            logger.error("a check failed to run", exc_info=task.exception())

    async def _send(self, peer: str, tag: Tag, message: bytes) -> None:
        try:
            await self.box.send(peer, tag, message)
        except Exception as e:  # a checker gone is its check lost, nothing more
            logger.info("evidence for %s not delivered: %s", peer[-8:], e)
