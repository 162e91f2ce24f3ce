"""DiLoCo outer steps with an in-process all-reduce over simulated replicas."""

import asyncio

import torch

from potluck.peer.collectives.diloco import DiLoCo
from potluck.peer.config import DiLoCoConfig


def make_replicas(n, seed=0):
    torch.manual_seed(seed)
    base = torch.nn.Linear(8, 1)
    reps = []
    for _ in range(n):
        m = torch.nn.Linear(8, 1)
        m.load_state_dict(base.state_dict())
        reps.append(m)
    return reps


async def train(reps, cfg, steps, data, codec=None):
    dilocos = [DiLoCo(m.parameters(), cfg) for m in reps]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in reps]
    pending: list[torch.Tensor] = []
    done = asyncio.Event()
    results: dict[int, torch.Tensor] = {}

    async def allreduce(t):
        """Mean over the replicas: returns once every replica has contributed."""
        pending.append(t if codec is None else codec.decode(codec.encode(t)))
        if len(pending) == len(reps):
            results[0] = torch.stack(pending).mean(0)
            done.set()
        await done.wait()
        return results[0]

    for step in range(steps):
        for i, (m, opt) in enumerate(zip(reps, opts, strict=True)):
            x, y = data[i][step]
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        if (step + 1) % cfg.inner_steps == 0:
            pending.clear()
            done.clear()
            await asyncio.gather(*(d.after_inner_step(allreduce) for d in dilocos))
        else:
            for d in dilocos:
                assert not await d.after_inner_step(None)  # no sync between
    return dilocos


def batches(n, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, 1, generator=g)
    out = []
    for _ in range(n):
        rows = []
        for _ in range(steps):
            x = torch.randn(16, 8, generator=g)
            rows.append((x, x @ w))
        out.append(rows)
    return out, w


def test_replicas_agree_after_every_sync_and_learn():
    reps = make_replicas(3)
    data, w = batches(3, 40)
    dl = asyncio.run(train(reps, DiLoCoConfig(inner_steps=4, outer_lr=0.7, outer_momentum=0.9), 40, data))
    assert dl[0].syncs == 10
    for m in reps[1:]:
        for a, b in zip(m.parameters(), reps[0].parameters(), strict=True):
            assert torch.equal(a, b)
    err = float((reps[0].weight.detach().T - w).norm() / w.norm())
    assert err < 0.2


def test_h1_lr1_no_momentum_is_plain_data_parallel_sgd():
    reps = make_replicas(2, seed=3)
    data, _ = batches(2, 5, seed=4)
    asyncio.run(train(reps, DiLoCoConfig(inner_steps=1, outer_lr=1.0, outer_momentum=0.0), 5, data))
    ref = make_replicas(1, seed=3)[0]
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(5):
        opt.zero_grad()
        loss = (
            sum(torch.nn.functional.mse_loss(ref(data[i][step][0]), data[i][step][1]) for i in range(2)) / 2
        )
        loss.backward()
        opt.step()
    for a, b in zip(reps[0].parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compressed_pseudo_gradients_still_learn():
    from potluck.compression import get_codec

    reps = make_replicas(3)
    data, w = batches(3, 40)
    cfg = DiLoCoConfig(inner_steps=4, outer_lr=0.7, outer_momentum=0.9)
    asyncio.run(train(reps, cfg, 40, data, codec=get_codec("int4:block=32")))
    for m in reps[1:]:
        assert all(torch.equal(a, b) for a, b in zip(m.parameters(), reps[0].parameters(), strict=True))
    assert float((reps[0].weight.detach().T - w).norm() / w.norm()) < 0.25


def _step(m: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt.step()


def test_an_overlapped_outer_step_lands_on_the_same_snapshot_and_keeps_the_inner_step_under_it() -> None:
    """Streaming DiLoCo's overlap (compression.outer_overlap): a sync prepared after step H, its mean
    applied after step H + 1. The snapshot is the one a sync waited for at step H would make, on every
    replica; each replica's parameters are that snapshot plus what its own step H + 1 did."""
    cfg = DiLoCoConfig(inner_steps=2, outer_lr=0.7, outer_momentum=0.9)
    data, _ = batches(2, 3)

    def run(overlap: bool) -> tuple[list[DiLoCo], list[torch.nn.Module], list[torch.Tensor]]:
        reps = make_replicas(2)
        dilocos = [DiLoCo(m.parameters(), cfg) for m in reps]
        opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in reps]
        for step in range(2):
            for i, (m, opt) in enumerate(zip(reps, opts, strict=True)):
                _step(m, opt, *data[i][step])
            assert [d.count() for d in dilocos] == [step == 1] * 2  # due after the second
        mine = [d.prepare() for d in dilocos]
        mean = torch.stack([p.pseudo for p in mine]).mean(0)
        before = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in reps]
        if not overlap:
            for d in dilocos:
                d.apply_outer(mean)
        for i, (m, opt) in enumerate(zip(reps, opts, strict=True)):
            _step(m, opt, *data[i][2])  # step 3: under the sync, or after it
        flat = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in reps]
        moved = [f - b for f, b in zip(flat, before, strict=True)]
        if overlap:
            for d, p in zip(dilocos, mine, strict=True):
                d.apply_outer(mean, p.pseudo)
        return dilocos, reps, moved

    waited, _, _ = run(overlap=False)
    landed, reps, moved = run(overlap=True)
    for a, b in zip(waited, landed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.snapshot, b.snapshot, strict=True))
    for d, m, dm in zip(landed, reps, moved, strict=True):
        flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
        snap = torch.cat([s.reshape(-1) for s in d.snapshot])
        assert torch.allclose(flat, snap + dm, atol=1e-6)  # the snapshot plus its own inner step
        assert not torch.allclose(flat, snap, atol=1e-4)  # and that step was not dropped
    # the next sync's pseudo-gradient counts the carried step: snapshot - params = -(its update)
    assert torch.allclose(landed[0].pseudo_gradient(), -moved[0], atol=1e-6)
    # nothing ran under it (a pause right at the sync): the parameters are the snapshot, bit for bit
    reps = make_replicas(1)
    d = DiLoCo(reps[0].parameters(), cfg)
    _step(reps[0], torch.optim.SGD(reps[0].parameters(), lr=0.05), *data[0][0])
    mine = d.prepare()
    d.apply_outer(mine.pseudo.clone(), None)
    assert all(torch.equal(p, s) for p, s in zip(reps[0].parameters(), d.snapshot, strict=True))
