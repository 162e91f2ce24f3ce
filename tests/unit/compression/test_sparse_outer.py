"""SparseLoCo-style outer sync: decaying error feedback and DiLoCo's coded pseudo-gradient exchange."""

import asyncio

import pytest
import torch

from potluck.compression import DecodeError, EncodeError, ErrorFeedback, SpecError, get_codec
from potluck.peer.collectives.diloco import DiLoCo, OuterCodec
from potluck.peer.config import DiLoCoConfig

SPARSE = "topk:density=0.1,method=chunk,chunk=64|int2|zstd"


@pytest.mark.parametrize("spec", [SPARSE, "int2", "int4|zstd"])
def test_decay_scales_the_residual_before_it_is_added(spec):
    codec = get_codec(spec)
    g = torch.Generator().manual_seed(0)
    g1, g2 = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    ef = ErrorFeedback(decay=0.5)
    e1 = g1 - codec.decode(codec.encode(g1, key=(0, 1), state=ef))
    assert torch.allclose(ef.residual, e1, atol=1e-6)
    sent2 = codec.decode(codec.encode(g2, key=(1, 1), state=ef))
    assert torch.allclose(ef.residual, g2 + 0.5 * e1 - sent2, atol=1e-6)


def test_decay_one_is_plain_error_feedback_and_bad_decay_is_refused():
    codec = get_codec(SPARSE)
    x = torch.randn(500)
    a, b = ErrorFeedback(), ErrorFeedback(decay=1.0)
    for k in range(3):
        assert codec.encode(x, key=(k,), state=a) == codec.encode(x, key=(k,), state=b)
    assert torch.equal(a.residual, b.residual)
    with pytest.raises(EncodeError, match="decay"):
        ErrorFeedback(decay=1.5)


def replicas(n, numel=300, seed=0):
    torch.manual_seed(seed)
    base = torch.nn.Linear(numel // 3, 3, bias=False)
    out = []
    for _ in range(n):
        m = torch.nn.Linear(numel // 3, 3, bias=False)
        m.load_state_dict(base.state_dict())
        out.append(m)
    return out


def step_away(model, seed):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("spec", [SPARSE, "int2:block=512|zstd"])
def test_outer_payloads_round_trip_and_keep_what_was_not_sent(spec):
    (m,) = replicas(1)
    d = DiLoCo(m.parameters(), DiLoCoConfig(inner_steps=1), OuterCodec(spec, 0.9, part_elements=128))
    step_away(m, 1)
    pseudo = d.pseudo_gradient()
    payloads = d.encode_outer()
    assert len(payloads) == len(d.parts) == 3  # 300 elements in parts of 128
    sent = d.decode_outer([payloads])
    if spec == SPARSE:
        assert 0 < int((sent != 0).sum()) <= 0.1 * 300 + 3  # sparse: about density x n kept
    residual = torch.cat([ef.residual for ef in d.feedback])
    assert torch.allclose(sent + residual, pseudo, atol=1e-6)  # nothing lost, the rest waits
    step_away(m, 2)  # next sync: the new pseudo-gradient plus 0.9 x the residual
    want = d.pseudo_gradient() + 0.9 * residual
    sent2 = d.decode_outer([d.encode_outer()])
    assert torch.allclose(sent2 + torch.cat([ef.residual for ef in d.feedback]), want, atol=1e-5)


def test_outer_mean_over_contributors_and_lossless_chain_is_exact():
    a, b = replicas(2)
    oc = OuterCodec("none", part_elements=100)
    da, db = (DiLoCo(m.parameters(), DiLoCoConfig(inner_steps=1), oc) for m in (a, b))
    step_away(a, 1)
    step_away(b, 2)
    want = (da.pseudo_gradient() + db.pseudo_gradient()) / 2
    contributions = [da.encode_outer(), db.encode_outer()]
    assert torch.equal(da.decode_outer(contributions), db.decode_outer(contributions))
    assert torch.allclose(da.decode_outer(contributions), want, atol=1e-7)


def test_left_out_replica_keeps_its_whole_pseudo_gradient():
    (m,) = replicas(1)
    d = DiLoCo(m.parameters(), DiLoCoConfig(inner_steps=1), OuterCodec(SPARSE, 0.5, part_elements=128))
    step_away(m, 3)
    pseudo = d.pseudo_gradient()
    d.encode_outer()
    d.left_out()
    assert torch.allclose(torch.cat([ef.residual for ef in d.feedback]), pseudo, atol=1e-6)


def test_hostile_contributions_are_refused_with_the_contributor_named():
    (a,) = replicas(1)
    oc = OuterCodec(SPARSE, part_elements=128)
    da = DiLoCo(a.parameters(), DiLoCoConfig(inner_steps=1), oc)
    step_away(a, 1)
    good = da.encode_outer()
    other_codec = [get_codec("int8").encode(torch.zeros(n)) for _o, n in da.parts]
    wrong_size = [
        get_codec(SPARSE).encode(torch.ones(n + 1), key=(0, i)) for i, (_o, n) in enumerate(da.parts)
    ]
    truncated = [good[0][:-7], *good[1:]]
    flipped = [bytes([*good[0][:-1], good[0][-1] ^ 0xFF]), *good[1:]]
    for bad, what in [
        (other_codec, "codec"),
        (wrong_size, "shape"),
        (truncated, "contribution 1"),
        (flipped, "contribution 1"),
        (good[:2], "2 payloads"),
    ]:
        with pytest.raises(DecodeError, match=what):
            da.decode_outer([good, bad])
    with pytest.raises(DecodeError, match="no contribution"):
        da.decode_outer([])


def test_outer_codec_validates_its_settings():
    with pytest.raises(SpecError):
        OuterCodec("topk:density=2|int2")
    with pytest.raises(ValueError, match="ef_decay"):
        OuterCodec(SPARSE, ef_decay=1.2)


def test_sparse_sync_through_an_allgather_keeps_replicas_identical_and_learns():
    reps = replicas(3, numel=48)
    g = torch.Generator().manual_seed(7)
    w = torch.randn(16, 3, generator=g)
    cfg = DiLoCoConfig(inner_steps=4, outer_lr=1.0, outer_momentum=0.0)
    oc = OuterCodec("topk:density=0.25,method=chunk,chunk=16|int2", ef_decay=0.9)
    dilocos = [DiLoCo(m.parameters(), cfg, oc) for m in reps]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in reps]
    box: list[list[bytes]] = []
    ready = asyncio.Event()

    async def allgather(own):
        box.append(own)
        if len(box) == len(reps):
            ready.set()
        await ready.wait()
        return list(box)

    def loss(m):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(99))
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(m(x), x @ w))

    async def go():
        first = loss(reps[0])
        for step in range(40):
            for m, opt in zip(reps, opts, strict=True):
                x = torch.randn(8, 16, generator=g)
                opt.zero_grad()
                torch.nn.functional.mse_loss(m(x), x @ w).backward()
                opt.step()
            if (step + 1) % cfg.inner_steps == 0:
                box.clear()
                ready.clear()
            await asyncio.gather(*(d.after_inner_step(None, allgather) for d in dilocos))
        return first

    first = asyncio.run(go())
    for m in reps[1:]:
        assert torch.equal(m.weight, reps[0].weight)
    assert loss(reps[0]) < 0.5 * first
    assert dilocos[0].syncs == 10
