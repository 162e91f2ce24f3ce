"""Sub-network recipe: (|g|+1)-way labels, the oversampling count, the training index, pruning shapes."""

from __future__ import annotations

import pytest
import torch

from potluck.classpar.errors import PruneError
from potluck.classpar.model import SmallCNN, macs, model_macs
from potluck.classpar.prune import apoz, prune, select_channels
from potluck.classpar.subnet import oversample_count, relabel, soft_targets, training_index

torch.set_num_threads(1)


def test_relabel_maps_group_to_one_based_positions_and_others_to_zero() -> None:
    y = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 7, 2])
    got = relabel(y, [2, 7, 9])
    assert got.tolist() == [0, 0, 1, 0, 0, 0, 0, 2, 0, 3, 2, 1]
    assert got.dtype == y.dtype
    assert y.tolist()[0] == 0  # input untouched


@pytest.mark.parametrize(
    ("pos", "neg", "k", "want"),
    [(100, 900, 1.0, 800), (500, 500, 1.0, 0), (600, 400, 1.0, 0), (100, 900, 0.5, 350), (1, 2, 0.75, 1)],
)
def test_oversample_count_is_k_times_negatives_minus_positives(
    pos: int, neg: int, k: float, want: int
) -> None:
    assert oversample_count(pos, neg, k) == want


def test_training_index_adds_exactly_the_oversampled_positives() -> None:
    y = torch.arange(10).repeat(30)  # 30 of each class
    index = training_index(y, [3], k=1.0, seed=5)
    extra = index[len(y) :]
    assert len(extra) == oversample_count(30, 270) == 240
    assert set(y[extra].tolist()) == {3}
    # each positive drawn once per pass: 240 draws over 30 positives = 8 passes, each sample 8 times
    assert torch.bincount(extra, minlength=len(y))[y == 3].tolist() == [8] * 30
    assert torch.equal(index, training_index(y, [3], k=1.0, seed=5))
    assert not torch.equal(index, training_index(y, [3], k=1.0, seed=6))


def test_training_index_refuses_a_group_without_samples() -> None:
    with pytest.raises(PruneError):
        training_index(torch.zeros(5, dtype=torch.long), [4])


def test_prune_keeps_shapes_consistent_and_the_kept_channels_function() -> None:
    torch.manual_seed(0)
    model = SmallCNN((6, 8, 10, 12), num_outputs=10).eval()
    x = torch.randn(16, 1, 16, 16)
    keep = [[0, 2, 5], [1, 2, 3, 7], list(range(10)), [0, 11]]
    small = prune(model, keep).eval()
    assert small.widths == (3, 4, 10, 2)
    for conv, prev, width in zip(small.convs, (1, 3, 4, 10), (3, 4, 10, 2), strict=True):
        assert tuple(conv.weight.shape) == (width, prev, 3, 3)
    assert small.fc.in_features == 2 and small.fc.out_features == 10
    assert small(x).shape == (16, 10)
    # the first layer's kept channels compute exactly what they computed before
    full_act = model.activations(x)[0][:, [0, 2, 5]]
    assert torch.allclose(small.activations(x)[0], full_act)
    assert model_macs(small) == macs((3, 4, 10, 2), 10)


def test_pruning_everything_that_is_never_active_and_meeting_a_budget() -> None:
    scores = [torch.tensor([0.9, 0.1, 0.8, 0.2]), torch.tensor([0.5, 0.95, 0.6, 0.1, 0.74, 0.72])]
    keep = select_channels(scores, threshold=0.73, num_outputs=3, min_keep_fraction=0.0)
    assert keep == [[1, 3], [0, 2, 3, 5]]
    budget = macs((2, 2), 3)
    tight = select_channels(scores, threshold=0.73, num_outputs=3, macs_budget=budget, min_keep_fraction=0.0)
    assert [len(k) for k in tight] == [2, 2] and tight[1] == [0, 3]  # highest APoZ went first
    with pytest.raises(PruneError):
        select_channels(scores, num_outputs=3, macs_budget=1.0)


def test_apoz_counts_the_fraction_of_zero_activations() -> None:
    model = SmallCNN((2, 2, 2, 2), num_outputs=2).eval()
    with torch.no_grad():
        for conv, bn in zip(model.convs, model.bns, strict=True):
            conv.weight.zero_()
            bn.bias.copy_(torch.tensor([0.0, 1.0]))  # channel 0 always zero, channel 1 always one
    scores = apoz(model, torch.randn(3, 1, 16, 16))
    for s in scores:
        assert s.tolist() == [1.0, 0.0]


def test_soft_targets_fold_the_teacher_into_other_and_the_group() -> None:
    torch.manual_seed(1)
    teacher = SmallCNN((4, 4, 4, 4), num_outputs=5).eval()
    x, y = torch.randn(6, 1, 16, 16), torch.tensor([0, 1, 2, 3, 4, 1])
    hard = soft_targets(teacher, x, y, [1, 3], 0.0)
    assert torch.equal(hard.argmax(dim=1), relabel(y, [1, 3]))
    folded = soft_targets(teacher, x, y, [1, 3], 1.0)
    probs = torch.softmax(teacher(x), dim=1).detach()
    assert torch.allclose(folded[:, 1:], probs[:, [1, 3]])
    assert torch.allclose(folded.sum(dim=1), torch.ones(6))
    half = soft_targets(teacher, x, y, [1, 3], 0.5)
    assert torch.allclose(half, 0.5 * hard + 0.5 * folded)


def test_budget_pruning_lowers_the_threshold_in_every_layer_at_once() -> None:
    # the sparsest channels go first wherever they are: layer 0 down to its floor before layer 1 is touched
    scores = [torch.full((8,), 0.6) + torch.arange(8) * 0.01, torch.full((8,), 0.1) + torch.arange(8) * 0.01]
    keep = select_channels(scores, num_outputs=2, macs_budget=macs((4, 4), 2), min_keep_fraction=0.0)
    assert keep == [[0, 1], list(range(8))]
    assert macs([len(k) for k in keep], 2) <= macs((4, 4), 2)
