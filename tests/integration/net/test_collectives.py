"""Tree all-reduce on real p2pd daemons (one process, loopback): equal to gloo, identical on every peer,
and bit-exact with a pure reference of the same algorithm when the codec is lossy."""

import asyncio
import random
from collections import Counter

import pytest
import torch

from potluck.compression import get_codec
from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.peer.collectives.robust import Audit
from potluck.peer.collectives.tree import ring_allreduce, tree_allreduce
from potluck.peer.config import AllReduceConfig
from potluck.protocol.collective import AllReduceSchedule, TreeSpec, one_hop_schedule, split_elements
from potluck.testbed.harness.hostile import HostileMailbox
from potluck.testbed.harness.p2p import p2p_group
from tests.helpers.gloo import gloo_mean

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def random_schedule(peers: list[str], n_trees: int, rng: random.Random) -> AllReduceSchedule:
    trees = []
    for _ in range(n_trees):
        order = peers[:]
        rng.shuffle(order)  # order[0] is the root; each later peer hangs under an earlier one
        parent = {order[0]: None} | {p: order[rng.randrange(i)] for i, p in enumerate(order) if i}
        trees.append(TreeSpec(root=order[0], parent=parent, share=rng.uniform(0.2, 1.0)))
    return AllReduceSchedule(tuple(peers), tuple(trees))


def reference(inputs: dict[str, torch.Tensor], sched: AllReduceSchedule, cfg: AllReduceConfig, round_no: int):
    """The executor's arithmetic in one process: same slices, chunks, child order, codec and keys."""
    codec = get_codec(cfg.codec)
    n = next(iter(inputs.values())).numel()
    flats = {p: x.reshape(-1).float() for p, x in inputs.items()}
    out = torch.empty(n)
    n_chunks = max(1, -(-n // cfg.chunk_elements))
    offset = 0
    for t_idx, (tree, size) in enumerate(zip(sched.trees, split_elements(n, sched.shares), strict=True)):
        start = offset
        for c, csize in enumerate(split_elements(size, [1.0] * n_chunks)):

            def subtree(peer, lo=start, hi=start + csize, c=c, t_idx=t_idx, tree=tree):
                acc = flats[peer][lo:hi].clone()
                for child in tree.children(peer, sched.peers):
                    codec.decode_into(subtree(child), acc, accumulate=True)
                if tree.parent[peer] is None:
                    acc /= len(sched.peers)
                return codec.encode(acc, key=(round_no, t_idx, c))

            out[start : start + csize] = codec.decode(subtree(tree.root)).reshape(-1)
            start += csize
        offset += size
    return out


async def run_group(n: int, inputs: list[torch.Tensor], sched_fn, cfg: AllReduceConfig, round_no: int = 7):
    async with p2p_group(n) as nodes:
        boxes = [Mailbox(node, "potluck/test/allreduce/1", TransportConfig(timeout_s=20)) for node in nodes]
        for box in boxes:
            await box.start()
        sched = sched_fn([b.peer_id for b in boxes])
        results = await asyncio.gather(
            *(tree_allreduce(b, sched, x, round_no, cfg) for b, x in zip(boxes, inputs, strict=True))
        )
        for box in boxes:
            await box.close()
        return sched, [b.peer_id for b in boxes], results


@pytest.mark.parametrize(
    ("n", "n_trees", "numel", "chunk"),
    [(2, 1, 1000, 64), (3, 2, 5000, 777), (5, 3, 20000, 4096), (8, 4, 30000, 2500)],
)
def test_uncompressed_tree_allreduce_equals_gloo(n, n_trees, numel, chunk):
    rng = random.Random(n * 100 + n_trees)
    gen = torch.Generator().manual_seed(n)
    inputs = [torch.randn(numel, generator=gen) for _ in range(n)]
    cfg = AllReduceConfig(codec="none", chunk_elements=chunk, timeout_s=20)
    _, _, results = asyncio.run(run_group(n, inputs, lambda peers: random_schedule(peers, n_trees, rng), cfg))
    expected = gloo_mean(inputs)
    for r in results:
        assert torch.equal(r, results[0])  # bit-identical on every peer
    torch.testing.assert_close(results[0], expected, rtol=1e-5, atol=1e-6)


def test_lossy_codec_equals_its_reference_bit_for_bit():
    n, rng = 4, random.Random(3)
    gen = torch.Generator().manual_seed(11)
    inputs = [torch.randn(3000, generator=gen) for _ in range(n)]
    cfg = AllReduceConfig(codec="int8:block=64", chunk_elements=500, timeout_s=20)
    sched, peers, results = asyncio.run(run_group(n, inputs, lambda ps: random_schedule(ps, 2, rng), cfg))
    expected = reference(dict(zip(peers, inputs, strict=True)), sched, cfg, round_no=7)
    for r in results:
        assert torch.equal(r, expected)
    exact = torch.stack(inputs).mean(0)
    assert float((expected - exact).norm() / exact.norm()) < 0.02  # and the codec error stays small


@pytest.mark.parametrize(("n", "codec"), [(2, "none"), (4, "none"), (3, "int8:block=64")])
def test_ring_allreduce_equals_gloo_and_is_identical_everywhere(n, codec):
    gen = torch.Generator().manual_seed(n)
    inputs = [torch.randn(4099, generator=gen) for _ in range(n)]
    cfg = AllReduceConfig(codec=codec, timeout_s=20)

    async def main():
        async with p2p_group(n) as nodes:
            boxes = [Mailbox(node, "potluck/test/ring/1", TransportConfig(timeout_s=20)) for node in nodes]
            for box in boxes:
                await box.start()
            order = tuple(b.peer_id for b in boxes)
            out = await asyncio.gather(
                *(ring_allreduce(b, order, x, 1, cfg) for b, x in zip(boxes, inputs, strict=True))
            )
            for box in boxes:
                await box.close()
            return out

    results = asyncio.run(main())
    for r in results:
        assert torch.equal(r, results[0])
    tol = dict(rtol=1e-5, atol=1e-6) if codec == "none" else dict(rtol=0.0, atol=0.05)
    torch.testing.assert_close(results[0], gloo_mean(inputs), **tol)


def _one_hop_with_attacker(fn, rule: str, n: int = 5):
    """All-reduce over one-hop trees where the last peer rewrites each contribution it sends with ``fn``
    (its own shard it aggregates honestly); returns (results, honest inputs, audits, peer ids)."""
    gen = torch.Generator().manual_seed(5)
    inputs = [torch.randn(2000, generator=gen) + 1.0 for _ in range(n)]
    cfg = AllReduceConfig(codec="none", chunk_elements=250, timeout_s=20, rule=rule)
    audits = [Audit() for _ in range(n)]

    async def main():
        async with p2p_group(n) as nodes:
            tcfg = TransportConfig(timeout_s=20)
            boxes = [Mailbox(node, "potluck/test/robust/1", tcfg) for node in nodes[:-1]]
            boxes.append(HostileMailbox(nodes[-1], "potluck/test/robust/1", tcfg, fn=fn))
            for box in boxes:
                await box.start()
            sched = one_hop_schedule([b.peer_id for b in boxes])
            out = await asyncio.gather(
                *(
                    tree_allreduce(b, sched, x, 3, cfg, audit)
                    for b, x, audit in zip(boxes, inputs, audits, strict=True)
                )
            )
            for box in boxes:
                await box.close()
            return out, [b.peer_id for b in boxes]

    results, peers = asyncio.run(main())
    return results, inputs, audits, peers


def _nan(x):
    x = x.clone()
    x[0] = float("nan")
    return x


def test_a_nan_contribution_is_refused_and_the_others_mean_is_committed():
    results, inputs, audits, peers = _one_hop_with_attacker(_nan, "mean")
    for r in results:
        assert torch.equal(r, results[0])
    # the attacker's own shard holds its honest values (it aggregated that one itself); every other
    # shard is the mean of the four honest replicas: shard k is the k-th fifth of the buffer
    honest_mean, all_mean = torch.stack(inputs[:-1]).mean(0), torch.stack(inputs).mean(0)
    own = slice(4 * 400, 2000)
    torch.testing.assert_close(results[0][: 4 * 400], honest_mean[: 4 * 400], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[0][own], all_mean[own], rtol=1e-5, atol=1e-6)
    refused = sum((a.refused for a in audits), Counter())
    assert set(refused) == {peers[-1]} and refused[peers[-1]] == 4 * 8  # 4 owners x 8 chunks each


def test_centered_clip_holds_off_a_scaled_sign_flip_that_the_mean_follows():
    clipped, inputs, audits, peers = _one_hop_with_attacker(lambda x: -100.0 * x, "centered_clip")
    plain, *_ = _one_hop_with_attacker(lambda x: -100.0 * x, "mean")
    clean = torch.stack(inputs).mean(0)

    def err(x):
        return float((x - clean).norm() / clean.norm())

    assert all(torch.equal(r, clipped[0]) for r in clipped)
    # 5 replicas whose values spread as wide as their mean: a robust estimate sits ~0.35 from the mean
    assert err(clipped[0]) < 0.5 < 10 < err(plain[0]), (err(clipped[0]), err(plain[0]))
    assert {p for a in audits for p in a.clipped} == {peers[-1]}
