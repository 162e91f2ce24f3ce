"""Tree all-reduce over the peer mailbox: the executor of an ``AllReduceSchedule``.

The flat buffer is cut into one slice per tree (by share), and every slice into the same number of
chunks, so light and heavy trees fill their pipelines equally fast. Per tree and chunk:

- reduce: a peer waits for its children's partial sums (in the group's fixed order, so the float sums
  are reproducible), adds them to its own chunk and sends the result to its parent;
- broadcast: the root encodes the finished chunk (the mean when ``average``) ONCE, and those exact bytes
  travel down the tree, each peer forwarding them unchanged. Every peer, the root included, decodes the
  same bytes, so all replicas hold bit-identical results whatever the codec.

On a one-hop tree (a star: every replica sends its chunk straight to the root, which applies the
stage's aggregation rule) with a ``ledger``, contributions are sealed (chunk c of every tree under one
signature, ``peer/seal/batch.py``; a bad seal fails the step naming its sender), the root keeps its own
row and every peer the result it received, so that other replicas can audit the root's aggregation
after the step (``train/audit.py``). The result needs no seal: an auditor testifies to what it received
itself.

Reduce and broadcast run as separate coroutines per tree, so chunk c+1 climbs while chunk c descends.
Every receive has the schedule's timeout; any failure raises ``CollectiveError`` naming the peer.
``round_no`` is a packed ``net.tags.Round``: its messages are tagged tree t, chunk c, reduce or broadcast.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

import torch

from potluck.compression import Codec, all_finite, get_codec
from potluck.compression.errors import CompressionError
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Direction, Stream, Tag, make_tag
from potluck.peer.collectives.robust import Audit, combine
from potluck.peer.config import AllReduceConfig
from potluck.peer.errors import CollectiveError, ContributionError, SealError
from potluck.peer.seal import Batches, Ledger
from potluck.protocol.collective import AllReduceSchedule, TreeSpec, split_elements
from potluck.protocol.errors import WireError

logger = logging.getLogger(__name__)

OWN_ROW_CODEC = "none"  # the root keeps its own row for auditors bit for bit (raw fp32)


def tree_chunks(
    flat: torch.Tensor, schedule: AllReduceSchedule, cfg: AllReduceConfig
) -> list[list[torch.Tensor]]:
    """How a flat buffer travels: per tree of the schedule, its share cut into chunks (views of
    ``flat``). Every peer cuts alike, so chunk ``c`` of tree ``t`` names the same coordinates everywhere."""
    n_chunks = max(1, math.ceil(flat.numel() / cfg.chunk_elements))
    out, offset = [], 0
    for size in split_elements(flat.numel(), schedule.shares):
        part = flat[offset : offset + size]
        offset += size
        out.append(list(torch.split(part, split_elements(size, [1.0] * n_chunks))) if size else [])
    return out


async def tree_allreduce(
    box: Mailbox,
    schedule: AllReduceSchedule,
    tensor: torch.Tensor,
    round_no: int,
    cfg: AllReduceConfig,
    audit: Audit | None = None,
    ledger: Ledger | None = None,
) -> torch.Tensor:
    """All-reduce ``tensor`` (any shape, float) with the group; returns a new tensor, same on every peer.

    ``audit`` (optional) counts, per peer, the contributions this peer refused or found outlying;
    ``ledger`` (optional) seals one-hop trees' messages and keeps them for audits."""
    me = box.peer_id
    if me not in schedule.peers:
        raise CollectiveError(f"peer {me} is not in this all-reduce group")
    codec = get_codec(cfg.codec)
    flat = tensor.detach().reshape(-1).to(torch.float32).clone()
    cut = tree_chunks(flat, schedule, cfg)
    # one message per sealed (one-hop) tree and chunk: to its root, or the root's own row
    sealed = [
        bool(chunks) and _one_hop(schedule, tree) for tree, chunks in zip(schedule.trees, cut, strict=True)
    ]
    batches = Batches(ledger, sum(sealed)) if ledger is not None and any(sealed) else None
    runs = []
    for t_idx, (tree, chunks) in enumerate(zip(schedule.trees, cut, strict=True)):
        seals = batches if sealed[t_idx] else None
        runs.append(_run_tree(box, schedule, tree, t_idx, chunks, round_no, codec, cfg, audit, seals))
    tasks = [asyncio.create_task(run) for run in runs]
    try:
        await asyncio.gather(*tasks)
    except (WireError, CompressionError) as e:
        raise CollectiveError(f"all-reduce round {round_no} failed at {me}: {e}") from None
    finally:
        for task in tasks:  # on failure, stop the other trees' waits instead of leaving them running
            task.cancel()
    return flat.reshape(tensor.shape).to(tensor.dtype)


def _one_hop(schedule: AllReduceSchedule, tree: TreeSpec) -> bool:
    """Whether every replica sends straight to the tree's root (a star)."""
    root = next(p for p in schedule.peers if tree.parent[p] is None)
    return all(tree.parent[p] in (root, None) for p in schedule.peers)


async def _run_tree(
    box: Mailbox,
    schedule: AllReduceSchedule,
    tree: TreeSpec,
    t_idx: int,
    chunks: list[torch.Tensor],
    round_no: int,
    codec: Codec,
    cfg: AllReduceConfig,
    audit: Audit | None,
    seals: Batches | None = None,
) -> None:
    """One tree's reduce and broadcast; ``seals``: the round's batches (and through them this peer's
    ledger), when the tree's messages are sealed (a one-hop tree under audits)."""
    me = box.peer_id
    parent = tree.parent[me]
    children = tree.children(me, schedule.peers)
    finished: asyncio.Queue[bytes] = asyncio.Queue()  # root only: encoded results, in chunk order
    landed = 0  # chunks whose broadcast has reached this peer
    progress = asyncio.Condition()

    def reached(n: int) -> Callable[[], bool]:
        return lambda: landed >= n

    def up(c: int) -> Tag:
        return make_tag(round_no, Stream.TREE, index=t_idx, chunk=c, direction=Direction.REDUCE)

    def down(c: int) -> Tag:
        return make_tag(round_no, Stream.TREE, index=t_idx, chunk=c, direction=Direction.BROADCAST)

    # Where the root hears every replica unsummed (a star), it applies the stage's aggregation rule;
    # elsewhere children's partial sums are added, and one holding NaN or Inf fails the round naming it.
    star = parent is None and _one_hop(schedule, tree)

    def opened(sender: str, tag: Tag, data: bytes) -> bytes:
        if seals is None:
            return data
        try:  # its seal is checked off the loop, before the step's READY (Duties.seal)
            return seals.ledger.open_later(sender, tag, data)
        except SealError as e:
            raise ContributionError(sender, str(e)) from None

    async def reduce() -> None:
        for c, chunk in enumerate(chunks):
            if cfg.window > 0:  # cannot deadlock: it waits only on chunks whose reduce already left
                async with progress:
                    await progress.wait_for(reached(c - cfg.window))
            if star:
                acc = await gather_rows(c, chunk)
            else:
                acc = chunk.clone()
                if not all_finite(acc):
                    raise CollectiveError(f"this replica's own gradient holds NaN or Inf (round {round_no})")
                for child in children:
                    data = await box.recv(child, up(c), cfg.timeout_s)
                    codec.decode_into(data, acc, accumulate=True)
                    if not all_finite(acc):  # finite before this child's part: the part is to blame
                        if audit is not None:
                            audit.refused[child] += 1
                        raise ContributionError(child, f"{child} sent a partial sum holding NaN or Inf")
            key = (round_no, t_idx, c)
            if parent is None:
                if cfg.average and not star:
                    acc /= len(schedule.peers)
                await finished.put(codec.encode(acc, key=key))
            else:
                payload = codec.encode(acc, key=key)
                if seals is not None:  # out with chunk c of every other tree, under one signature
                    payload = await seals.seal(c, parent, up(c), payload)
                await box.send(parent, up(c), payload)

    async def gather_rows(c: int, own: torch.Tensor) -> torch.Tensor:
        """Every replica's chunk ``c`` as one row each (the group's order), the rule applied over them;
        the mean, or the sum when not ``cfg.average`` (the rule's mean times the group's size)."""
        rows, who = [own], [me]
        if seals is not None:  # its own row, exactly, for the auditors of this aggregation
            seals.add(c, me, up(c), get_codec(OWN_ROW_CODEC).encode(own.contiguous()))
        for child in children:
            data = opened(child, up(c), await box.recv(child, up(c), cfg.timeout_s))
            rows.append(codec.decode_into(data, torch.empty_like(own), accumulate=False))
            who.append(child)
        banned = audit.excluded if audit is not None else set()
        try:
            out = combine(torch.stack(rows), who, cfg.rule, cfg.trim, cfg.average, banned)
        except ValueError as e:
            raise CollectiveError(f"round {round_no}: {e}") from None
        for peer in out.refused:
            if peer not in banned:
                logger.warning("refused %s's contribution to round %d: NaN or Inf", peer, round_no)
        if audit is not None:
            audit.seen.update(who)
            audit.refused.update(out.refused)
            audit.clipped.update(out.clipped)
        return out.result

    async def broadcast() -> None:
        nonlocal landed
        for c, chunk in enumerate(chunks):
            if parent is None:
                data = await finished.get()
            else:
                data = await box.recv(parent, down(c), cfg.timeout_s)
                if seals is not None:  # what the owner told this peer, for its audits (no seal needed:
                    seals.ledger.keep(parent, down(c), data)  # an auditor testifies to what it received)
            # Children sit on different links: send to all at once, not one paced transfer after
            # another (gather, not a TaskGroup: a WireError must reach tree_allreduce unwrapped).
            await asyncio.gather(*(box.send(child, down(c), data) for child in children))
            codec.decode_into(data, chunk, accumulate=False)
            if parent is not None and not all_finite(chunk):
                raise ContributionError(parent, f"{parent} broadcast a result holding NaN or Inf")
            async with progress:
                landed = c + 1
                progress.notify_all()

    await asyncio.gather(reduce(), broadcast())


async def ring_allreduce(
    box: Mailbox, order: tuple[str, ...], tensor: torch.Tensor, round_no: int, cfg: AllReduceConfig
) -> torch.Tensor:
    """The classic ring (reduce-scatter, then all-gather) on the same mailbox: the baseline for trees.

    Segment s ends its reduce-scatter at peer (s - 1) mod N, which encodes the finished segment once;
    all-gather forwards those exact bytes, so every peer again decodes identical bits.
    """
    me = box.peer_id
    n = len(order)
    if me not in order or len(set(order)) != n:
        raise CollectiveError(f"peer {me} is not in ring {order}")
    codec = get_codec(cfg.codec)
    flat = tensor.detach().reshape(-1).to(torch.float32).clone()
    if n == 1:
        return flat.reshape(tensor.shape).to(tensor.dtype)
    i = order.index(me)
    nxt, prv = order[(i + 1) % n], order[(i - 1) % n]
    segments = list(torch.split(flat, split_elements(flat.numel(), [1.0] * n)))

    def ring_tag(segment: int, step: int, direction: Direction) -> Tag:
        return make_tag(round_no, Stream.RING, index=segment, chunk=step, direction=direction)

    try:
        for step in range(n - 1):  # reduce-scatter: after step k, segment (i - k - 1) holds k + 2 inputs
            send_s, recv_s = (i - step) % n, (i - step - 1) % n
            payload = codec.encode(segments[send_s], key=(round_no, send_s, step))
            sending = asyncio.create_task(box.send(nxt, ring_tag(send_s, step, Direction.REDUCE), payload))
            data = await box.recv(prv, ring_tag(recv_s, step, Direction.REDUCE), cfg.timeout_s)
            codec.decode_into(data, segments[recv_s], accumulate=True)
            if not all_finite(segments[recv_s]):
                raise ContributionError(prv, f"{prv} sent a partial sum holding NaN or Inf")
            await sending
        own = (i + 1) % n  # the segment this peer finished
        if cfg.average:
            segments[own] /= n
        data = codec.encode(segments[own], key=(round_no, own, n))
        codec.decode_into(data, segments[own], accumulate=False)
        for step in range(n - 1):  # all-gather: pass finished segments along unchanged
            send_s, recv_s = (own - step) % n, (own - step - 1) % n
            sending = asyncio.create_task(box.send(nxt, ring_tag(send_s, step, Direction.BROADCAST), data))
            data = await box.recv(prv, ring_tag(recv_s, step, Direction.BROADCAST), cfg.timeout_s)
            codec.decode_into(data, segments[recv_s], accumulate=False)
            await sending
    except (WireError, CompressionError) as e:
        raise CollectiveError(f"ring all-reduce round {round_no} failed at {me}: {e}") from None
    return flat.reshape(tensor.shape).to(tensor.dtype)
