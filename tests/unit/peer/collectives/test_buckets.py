"""Gradient buckets: backward order, about the asked size, and never more than the tag phases of a step."""

import math
import random

from potluck.net.tags import BUCKET_PHASES
from potluck.peer.collectives.buckets import MAX_BUCKETS, _bucketize


def test_buckets_follow_the_backward_order_and_the_cap():
    sizes = [10, 20, 30, 40, 50]
    assert _bucketize(sizes, 60) == [[4], [3], [2, 1, 0]]
    assert _bucketize(sizes, 1000) == [[4, 3, 2, 1, 0]]


def test_bucket_count_never_exceeds_the_tag_phases():
    rng = random.Random(0)
    for _ in range(200):
        sizes = [rng.choice([64, 4096, 1 << 20]) for _ in range(rng.randrange(1, 80))]
        buckets = _bucketize(sizes, max(1, math.ceil(sum(sizes) / MAX_BUCKETS)))
        assert len(buckets) <= BUCKET_PHASES
        assert [i for b in buckets for i in b] == list(reversed(range(len(sizes))))
    # a pathological cap: one bucket per parameter would need 40 phases; the cap grows until they fit
    assert len(_bucketize([100] * 40, 1)) <= BUCKET_PHASES
