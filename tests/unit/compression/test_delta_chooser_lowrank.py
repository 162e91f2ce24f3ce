from __future__ import annotations

from pathlib import Path

import pytest
import torch

from potluck.compression import DecodeError, ErrorFeedback, get_codec
from potluck.compression.chooser import LADDERS, choose, estimate_seconds
from potluck.compression.delta import DeltaCoder


def _acts(ids: list[int], drift: float, epoch: int) -> torch.Tensor:
    base = torch.stack([torch.randn(8, 32, generator=torch.Generator().manual_seed(s)) for s in ids])
    noise = torch.stack(
        [torch.randn(8, 32, generator=torch.Generator().manual_seed(1000 * epoch + s)) for s in ids]
    )
    return base + drift * noise


@pytest.mark.parametrize("disk", [False, True])
def test_delta_caches_stay_identical_and_deltas_are_cheap_and_accurate(disk: bool, tmp_path: Path) -> None:
    kw = {"bits": 2, "first": 8, "capacity": 100}
    tx = DeltaCoder(**kw, disk_dir=tmp_path / "tx" if disk else None)  # type: ignore[arg-type]
    rx = DeltaCoder(**kw, disk_dir=tmp_path / "rx" if disk else None)  # type: ignore[arg-type]
    ids = list(range(16))
    sizes, errors = [], []
    for epoch in range(3):
        for batch in (ids[:8], ids[8:]):
            a = _acts(batch, 0.01, epoch)
            data = tx.encode(a, batch)
            y = rx.decode(data)
            sizes.append(len(data))
            errors.append(float((y - a).norm() / a.norm()))
    for s in ids:
        assert torch.equal(tx.cache.get(s), rx.cache.get(s))
    assert sizes[2] < sizes[0] / 2.5  # 2-bit deltas vs 8-bit first visit (plus ids and header)
    assert max(errors[2:]) < 0.05  # a 2-bit delta of a 1% change: far below direct 2-bit's ~70%
    assert tx.hit_rate == pytest.approx(2 / 3)


def test_delta_cache_is_bounded_and_switches_off_without_revisits() -> None:
    tx, rx = DeltaCoder(capacity=10, warmup=64), DeltaCoder(capacity=10, warmup=64)
    for step in range(20):
        batch = list(range(step * 8, step * 8 + 8))  # never revisited
        rx.decode(tx.encode(_acts(batch, 0.0, 0), batch))
        assert len(tx.cache) <= 10 and len(rx.cache) <= 10
    assert not tx.enabled and not rx.enabled
    assert len(tx.cache) == len(rx.cache) == 0


def test_delta_receiver_detects_missing_cache_entries() -> None:
    tx, rx = DeltaCoder(), DeltaCoder()
    a = _acts([1, 2], 0.0, 0)
    tx.encode(a, [1, 2])  # the receiver never saw this payload
    with pytest.raises(DecodeError, match="out of sync"):
        rx.decode(tx.encode(a, [1, 2]))


def test_powersgd_warm_start_improves_approximation_of_a_fixed_matrix() -> None:
    g = torch.Generator().manual_seed(0)
    m = torch.randn(64, 8, generator=g) @ torch.randn(8, 48, generator=g) + 0.01 * torch.randn(
        64, 48, generator=g
    )
    codec = get_codec("powersgd:rank=8|none")
    st = ErrorFeedback(enabled=True)
    errs = []
    for r in range(4):
        st.residual = None  # isolate warm start from error feedback
        errs.append(float((codec.decode(codec.encode(m, key=r, state=st)) - m).norm() / m.norm()))
    assert errs[-1] < errs[0] and errs[-1] < 0.05
    assert len(codec.encode(m)) < m.numel() * 4 / 2


def test_powersgd_falls_back_to_dense_for_small_or_1d_tensors() -> None:
    for shape in ((100,), (3, 3)):
        x = torch.randn(shape)
        assert torch.equal(get_codec("powersgd:rank=4").decode(get_codec("powersgd:rank=4").encode(x)), x)


def test_chooser_degrades_with_bandwidth_and_never_lowers_quality_needlessly() -> None:
    n, compute = 50_000_000, 5.0
    order = LADDERS["gradient"]
    ranks = [
        order.index(choose(n, "gradient", mbit * 125_000, compute).spec) for mbit in (10000, 1000, 100, 10)
    ]
    assert ranks == sorted(ranks) and ranks[0] == 0 and ranks[-1] > ranks[1]
    c = choose(n, "gradient", 100 * 125_000, compute)
    assert c.fits and c.seconds <= compute
    if order.index(c.spec) > 0:  # the next better chain would not have fit
        assert estimate_seconds(order[order.index(c.spec) - 1], n, 100 * 125_000)[1] > compute


def test_chooser_hysteresis_and_infeasible_budget() -> None:
    n, link = 10_000_000, 100 * 125_000
    free = choose(n, "activation", link, 10.0)
    _, t = estimate_seconds(free.spec, n, link)
    # at a budget just above the chain's time: chosen fresh, but not when moving up from a cheaper one
    assert choose(n, "activation", link, t * 1.01).spec == free.spec
    cheaper = LADDERS["activation"][-1]
    assert choose(n, "activation", link, t * 1.01, previous=cheaper).spec != free.spec
    hopeless = choose(n, "gradient", 1000.0, 0.001)
    assert not hopeless.fits
    with pytest.raises(ValueError):
        choose(n, "nope", link, 1.0)
