"""Who builds and who serves: class groups and coded workers dealt to peers by measured speed.

Pure: peers come in as ``{peer id: speed}`` (any unit that orders them, e.g. measured TFLOP/s), and
the same input always gives the same answer (ties broken by peer id), so a restarted coordinator deals
the same way. This is the policy half of the coordinator side of a ``class_parallel`` job
(docs/class-parallel.md); publishing the result as a signed plan is the coordinator's business.

- Builders: every group's sub-network is about as costly to build (one budget for all), so groups are
  dealt round-robin to peers from the fastest down; peers slower than ``min_fraction`` of the median
  build nothing (they would finish last and hold the job back) unless that would leave no builder.
- Serving: a parity worker evaluates ``weight`` sub-networks per query, so the heaviest workers go to
  the fastest peers. With fewer peers than workers a peer holds several workers; its loss then costs
  all of them at once, which the code tolerates only if they are no more than r.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping

from potluck.classpar.code import ErasureCode
from potluck.classpar.errors import GroupingError

logger = logging.getLogger(__name__)


def by_speed(peers: Mapping[str, float]) -> list[str]:
    """Peer ids from the fastest down; equal speeds in id order."""
    return sorted(peers, key=lambda p: (-peers[p], p))


def assign_builders(num_groups: int, peers: Mapping[str, float], *, min_fraction: float = 0.5) -> list[str]:
    """The peer that builds each group's sub-network (index = group)."""
    if not peers:
        raise GroupingError("no peers to build sub-networks on")
    median = statistics.median(peers.values())
    fast = [p for p in by_speed(peers) if peers[p] >= min_fraction * median] or by_speed(peers)
    out = [fast[g % len(fast)] for g in range(num_groups)]
    logger.debug("builders: %s", out)
    return out


def assign_workers(code: ErasureCode, peers: Mapping[str, float]) -> list[str]:
    """The peer that serves each coded worker (index = worker), heaviest workers on the fastest peers."""
    if not peers:
        raise GroupingError("no peers to serve on")
    ranked = by_speed(peers)
    weights = code.weights()
    order = sorted(range(code.n), key=lambda j: (-weights[j], j))
    out = [""] * code.n
    for rank, worker in enumerate(order):
        out[worker] = ranked[rank % len(ranked)]
    shared = code.n - len(set(out))
    if shared:
        logger.warning("%d workers share peers (%d peers for %d workers)", shared, len(ranked), code.n)
    return out


def tolerates_loss_of_any_peer(code: ErasureCode, holders: list[str]) -> bool:
    """Whether the replies of the workers on the other peers still decode, whichever one peer is lost."""
    return all(code.decodable([j for j, h in enumerate(holders) if h != lost]) for lost in set(holders))
