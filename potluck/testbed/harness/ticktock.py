"""Tick-tock checks shared by the unit tests and scripts/bench_tick_tock.py.

W3: a float64 regression (a two-layer tanh MLP, mean squared error, AdamW) trained by two tick-tock
waves under the synchronous inter-wave rule, against a pure-numpy simulation of that rule. End to end:
a small transformer trained by two waves on one "device" against two separate replicas (StageRunner,
forward/backward per micro-batch, gradients summed as the all-reduce sums them).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from potluck.model.layerwise import Layerwise, stage_layers
from potluck.model.memprofile import measure_profile, offset_of
from potluck.model.optim import clip_coefficient
from potluck.model.stage import StageRunner
from potluck.peer.train.ticktock import TickTock, merge_gradients
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec

LR, BETAS, EPS, WEIGHT_DECAY = 0.05, (0.9, 0.95), 1e-8, 0.01
ADAM = {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WEIGHT_DECAY}
Data = list[list[list[tuple[np.ndarray, np.ndarray, float]]]]  # [step][wave][micro] = (x, y, weight)


def regression_data(steps: int, seed: int = 0, d: int = 6, micro: tuple[int, ...] = (5, 3, 4)) -> Data:
    """Each step: two waves, each with micro-batches of the sizes in ``micro`` (uneven on purpose);
    weights are each micro-batch's share of the step's samples."""
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=d)
    total = 2 * sum(micro)
    out: Data = []
    for _ in range(steps):
        step = []
        for _wave in range(2):
            mbs = []
            for n in micro:
                x = rng.normal(size=(n, d))
                y = np.tanh(x @ true_w)[:, None] + 0.1 * rng.normal(size=(n, 1))
                mbs.append((x, y, n / total))
            step.append(mbs)
        out.append(step)
    return out


def init_mlp(seed: int = 1, d: int = 6, h: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.5, (h, d)), rng.normal(0, 0.1, h), rng.normal(0, 0.5, (1, h)), np.zeros(1)]


def numpy_sim(data: Data, params: list[np.ndarray]) -> list[list[np.ndarray]]:
    """The rule in numpy: sum every micro-batch's weighted MSE gradient over both waves, one AdamW step
    (torch's decoupled decay and bias corrections). Returns the parameters after each step."""
    p = [a.copy() for a in params]
    m = [np.zeros_like(a) for a in p]
    v = [np.zeros_like(a) for a in p]
    lr, (b1, b2), eps, wd = LR, BETAS, EPS, WEIGHT_DECAY
    trace = []
    for t, step in enumerate(data, start=1):
        g = [np.zeros_like(a) for a in p]
        for wave in step:
            for x, y, weight in wave:
                w1, c1, w2, c2 = p
                hid = np.tanh(x @ w1.T + c1)
                err = hid @ w2.T + c2 - y
                dout = 2.0 * err / err.size * weight
                dh = (dout @ w2) * (1.0 - hid**2)
                for k, gk in enumerate((dh.T @ x, dh.sum(0), dout.T @ hid, dout.sum(0))):
                    g[k] += gk
        for k in range(4):
            p[k] *= 1.0 - lr * wd
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            denom = np.sqrt(v[k]) / np.sqrt(1 - b2**t) + eps
            p[k] -= lr / (1 - b1**t) * m[k] / denom
        trace.append([a.copy() for a in p])
    return trace


class _Mlp(nn.Module):
    def __init__(self, params: list[np.ndarray]) -> None:
        super().__init__()
        self.l1 = nn.Linear(params[0].shape[1], params[0].shape[0], dtype=torch.float64)
        self.l2 = nn.Linear(params[2].shape[1], 1, dtype=torch.float64)
        with torch.no_grad():
            for t, a in zip(
                (self.l1.weight, self.l1.bias, self.l2.weight, self.l2.bias), params, strict=True
            ):
                t.copy_(torch.from_numpy(a))

    def layerwise(self) -> Layerwise:
        return Layerwise([lambda x: torch.tanh(self.l1(x)), self.l2], nn.functional.mse_loss)


def torch_ticktock(
    data: Data, params: list[np.ndarray], budget_ratio: float | None = None
) -> list[list[np.ndarray]]:
    """Two float64 waves under TickTock, the tock d* behind (budget ``budget_ratio`` x one wave's
    measured peak, or none: the MLP is too small for its timing to mean much), merged and stepped after
    every step. Returns wave 0's parameters after each step (wave 1's are checked equal)."""
    nets = [_Mlp(params), _Mlp(params)]
    opts = [torch.optim.AdamW(n.parameters(), foreach=False, **ADAM) for n in nets]  # type: ignore[arg-type]
    x0, y0, _ = data[0][0][0]
    probe = _Mlp(params)
    batch = (torch.from_numpy(x0), torch.from_numpy(y0))
    profile = measure_profile(probe.layerwise(), lambda: batch, list(probe.parameters()), repeats=2)
    budget = None if budget_ratio is None else budget_ratio * profile.peak_bytes
    tt = TickTock([n.layerwise() for n in nets], profile, budget, [list(n.parameters()) for n in nets])
    trace = []
    for step in data:
        tt.run_step([[(torch.from_numpy(x), torch.from_numpy(y), w) for x, y, w in wave] for wave in step])
        merge_gradients([list(n.parameters()) for n in nets])
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        a, b = ([t.detach().numpy().copy() for t in n.parameters()] for n in nets)
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)), "the waves diverged"
        trace.append(a)
    return trace


def torch_sync_dp(data: Data, params: list[np.ndarray]) -> list[list[np.ndarray]]:
    """The baseline: one replica runs all of a step's micro-batches (the same total batch), one step."""
    net = _Mlp(params)
    opt = torch.optim.AdamW(net.parameters(), foreach=False, **ADAM)  # type: ignore[arg-type]
    lw = net.layerwise()
    trace = []
    for step in data:
        for wave in step:
            for x, y, w in wave:
                lw.run(torch.from_numpy(x), torch.from_numpy(y), w)
        opt.step()
        opt.zero_grad(set_to_none=True)
        trace.append([t.detach().numpy().copy() for t in net.parameters()])
    return trace


def max_err(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> float:
    return max(
        float(np.max(np.abs(x - y))) for sa, sb in zip(a, b, strict=True) for x, y in zip(sa, sb, strict=True)
    )


# ---- end to end: a transformer, two waves on one device vs two separate replicas -------------------------

TINY = ModelSpec(n_layers=3, d_model=32, n_heads=4, vocab_size=64, seq_len=16)
OPT = OptimizerSpec(lr=3e-3, warmup_steps=0)


def token_batches(steps: int, spec: ModelSpec, micro: int = 2, size: int = 2, seed: int = 0) -> list:
    """[step][replica][micro] = (inputs, targets, weight) of random tokens."""
    g = torch.Generator().manual_seed(seed)
    total = 2 * micro * size
    out = []
    for _ in range(steps):
        per = []
        for _r in range(2):
            mbs = []
            for _m in range(micro):
                x = torch.randint(0, spec.vocab_size, (size, spec.seq_len + 1), generator=g)
                mbs.append((x[:, :-1], x[:, 1:], size / total))
            per.append(mbs)
        out.append(per)
    return out


def _step(runners: list[StageRunner]) -> None:
    sq = runners[0].grad_sq_norm()
    coef = clip_coefficient(OPT, sq**0.5)
    for r in runners:
        r.step(OPT.lr, coef)


def separate_replicas(batches: list, spec: ModelSpec = TINY) -> list[float]:
    """Two replicas as two peers run them: forward/backward per micro-batch, SUM of gradients, step."""
    reps = [StageRunner(spec, 0, spec.n_layers, 0, OPT) for _ in range(2)]
    losses = []
    for step in batches:
        for r, mbs in zip(reps, step, strict=True):
            for m, (x, y, w) in enumerate(mbs):
                losses.append(float(r.forward(m, x, y, w)))
                r.backward(m)
        total = reps[0].grad_vector() + reps[1].grad_vector()
        for r in reps:
            r.set_grad_vector(total)
        _step(reps)
    return losses


def ticktock_replicas(batches: list, spec: ModelSpec = TINY, budget_ratio: float = 1.4) -> list[float]:
    """The same two replicas as two tick-tock waves on one device, under the accounted budget."""
    reps = [StageRunner(spec, 0, spec.n_layers, 0, OPT) for _ in range(2)]
    probe = StageRunner(spec, 0, spec.n_layers, 0, OPT)
    x0, y0, _ = batches[0][0][0]
    profile = measure_profile(stage_layers(probe.model), lambda: (x0, y0), probe.params, repeats=2)
    # a profile measured on a loaded machine may need more than budget_ratio x its peak to admit a pair
    budget = max(budget_ratio * profile.peak_bytes, offset_of(profile).combined_peak)
    tt = TickTock([stage_layers(r.model) for r in reps], profile, budget, [r.params for r in reps])
    losses = []
    for step in batches:
        report = tt.run_step(step)
        losses += [loss for wave in report.losses for loss in wave]
        merge_gradients([r.params for r in reps])
        _step(reps)
    return losses
