import pytest
import torch

from potluck.model.transformer import StageModel
from potluck.protocol.jobspec import ModelSpec

SPEC = ModelSpec(n_layers=4, d_model=64, n_heads=4, vocab_size=256, seq_len=32)


def test_chained_stages_equal_the_whole_model():
    whole = StageModel(SPEC, 0, 4, seed=7)
    stages = [StageModel(SPEC, 0, 1, seed=7), StageModel(SPEC, 1, 3, seed=7), StageModel(SPEC, 3, 4, seed=7)]
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    h = x
    for s in stages:
        h = s(h)
    torch.testing.assert_close(h, whole(x), rtol=1e-5, atol=1e-5)
    assert h.shape == (2, 32, 256)


def test_init_depends_on_seed_and_layer_not_on_the_split():
    a = StageModel(SPEC, 1, 3, seed=7)
    b = StageModel(SPEC, 2, 4, seed=7)
    torch.testing.assert_close(a.layers[1].qkv.weight, b.layers[0].qkv.weight, rtol=0, atol=0)  # layer 2
    assert not torch.equal(a.layers[0].qkv.weight, a.layers[1].qkv.weight)
    c = StageModel(SPEC, 1, 3, seed=8)
    assert not torch.equal(a.layers[0].qkv.weight, c.layers[0].qkv.weight)


def test_causal_and_trainable():
    torch.manual_seed(0)
    m = StageModel(SPEC, 0, 4, seed=1)
    x = torch.randint(0, 256, (2, 32))
    y = x.clone()
    y[:, 20:] = (y[:, 20:] + 1) % 256  # change only the future
    torch.testing.assert_close(m(x)[:, :20], m(y)[:, :20])
    # a few steps of AdamW memorise a fixed sequence
    data = torch.arange(33) % 256
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = StageModel.loss(m(data[None, :-1]), data[None, 1:])
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first
    assert SPEC.ffn_hidden % 64 == 0


@pytest.mark.parametrize(
    "shape",
    [(4, 64, 4, 256, 32), (3, 48, 2, 100, 16), (2, 96, 3, 1000, 8), (1, 200, 5, 7, 4), (5, 1000, 10, 50, 4)],
)
@pytest.mark.parametrize(
    "family",  # the Llama family's variations: grouped queries with q/k/v biases (Qwen2), a given width
    [{}, {"n_kv_heads": 1, "qkv_bias": True}, {"ffn_width": 72, "tie_embeddings": True}],
)
def test_parameter_count_equals_the_spec_arithmetic(shape, family):
    n_layers, d_model, n_heads, vocab_size, seq_len = shape
    spec = ModelSpec(
        n_layers=n_layers, d_model=d_model, n_heads=n_heads, vocab_size=vocab_size, seq_len=seq_len, **family
    )
    whole = StageModel(spec, 0, n_layers, seed=0)
    assert sum(p.numel() for p in whole.parameters()) == spec.n_params
    block = whole.layers[0]
    assert block.down.in_features == spec.ffn_hidden
    assert sum(p.numel() for p in block.parameters()) == spec.params_per_layer
    matmuls = (block.qkv, block.proj, block.gate_up, block.down)
    assert sum(m.weight.numel() for m in matmuls) == spec.matmul_params_per_layer
    assert whole.embed is not None and whole.embed.weight.numel() == spec.embed_params
    if n_layers > 1:  # a last stage holds its layers, the final norm and the head (no embedding)
        last = StageModel(spec, 1, n_layers, seed=0)
        assert sum(p.numel() for p in last.parameters()) == (
            (n_layers - 1) * spec.params_per_layer + spec.embed_params + d_model
        )


@pytest.mark.parametrize(
    "extra", [{}, {"bottleneck_rank": 8, "bottleneck_tokens": True}, {"n_kv_heads": 1, "qkv_bias": True}]
)
def test_a_stage_built_unset_then_drawn_is_the_stage_built_drawn(extra):
    spec = ModelSpec(n_layers=4, d_model=32, n_heads=2, vocab_size=64, seq_len=16, **extra)
    drawn = StageModel(spec, 1, 4, seed=5, cuts=[2] if extra.get("bottleneck_rank") else None)
    unset = StageModel.unset(
        spec, 1, 4, 5, [2] if extra.get("bottleneck_rank") else None, torch.device("cpu")
    )
    unset.init()
    a, b = drawn.state_dict(), unset.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(drawn.cos, unset.cos) and torch.equal(drawn.sin, unset.sin)
