"""DHT traffic per peer: Kademlia lookups measured on a simulated id space, times the records peers keep.

Kademlia (Maymounkov and Mazieres, IPTPS 2002): 64-bit ids here (160 in the paper; the hop count
depends on N, not on the id width), buckets of ``k`` contacts per shared-prefix length, iterative
lookups with ``alpha`` queries in flight. A node's bucket b holds up to k nodes that share exactly b
leading bits with it; such nodes form one contiguous range of the sorted ids, so a routing table is
a draw of k from each range (pseudo-random per node and bucket, like a long-lived table). A queried
node returns k contacts from its bucket at the prefix it shares with the target (every node it knows
closer to the target lives there), topped up from its other buckets, nearest first, to k. The lookup
stops when a round brings nothing closer and the k closest known have all been queried.

Per peer and minute, a peer stores its heartbeat every ``refresh_s`` (a lookup, then a STORE to the k
closest), a link report every ``link_report_s``, and refreshes one bucket per ``bucket_refresh_s``
(a lookup); every request has a response, and the receiving side's load equals the sending side's on
average, so messages sent plus received per peer = 2 x 2 x (requests a peer issues). The coordinator's
reads of every heartbeat (O(N) per poll) are its own load and are reported apart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from potluck.sim.errors import SimError

logger = logging.getLogger(__name__)

BITS = 64


@dataclass(frozen=True)
class DhtConfig:
    k: int = 20  # bucket size and replication factor (hivemind's default is 20)
    alpha: int = 3  # parallel queries
    refresh_s: float = 10.0  # heartbeat re-publication
    link_report_s: float = 60.0
    bucket_refresh_s: float = 600.0


class Kademlia:
    def __init__(self, n: int, rng: np.random.Generator, k: int = 20) -> None:
        if n < 2:
            raise SimError(f"a DHT needs >= 2 nodes, not {n}")
        self.ids = np.unique(rng.integers(0, 2**63 - 1, size=n, dtype=np.int64).astype(np.uint64))
        self.n, self.k, self.seed = len(self.ids), k, int(rng.integers(0, 2**31))

    def _range(self, node: int, bucket: int) -> tuple[int, int]:
        """Sorted-index range of nodes sharing exactly `bucket` leading bits with `node`."""
        nid = int(self.ids[node])
        flip = nid ^ (1 << (BITS - 1 - bucket))
        low_bits = BITS - 1 - bucket
        lo_id = (flip >> low_bits) << low_bits
        hi_id = lo_id + (1 << low_bits)
        lo = int(np.searchsorted(self.ids, np.uint64(lo_id), side="left"))
        hi = int(np.searchsorted(self.ids, np.uint64(min(hi_id, 2**64 - 1)), side="left"))
        return lo, hi

    def contacts(self, node: int, bucket: int) -> np.ndarray:
        lo, hi = self._range(node, bucket)
        if hi - lo <= self.k:
            return np.arange(lo, hi)
        draw = np.random.default_rng((self.seed, node, bucket))
        return lo + draw.choice(hi - lo, size=self.k, replace=False)

    def closest_known(self, node: int, target: int) -> list[int]:
        """The k contacts of `node` closest to `target`: its bucket at their shared prefix c holds every
        known node closer than itself; deeper buckets hold nodes about as close as it; shallower, farther."""
        d = int(self.ids[node]) ^ int(target)
        c = BITS if d == 0 else BITS - d.bit_length()
        out: list[int] = []
        for b in [*range(min(c, BITS - 1), BITS), *range(min(c, BITS) - 1, -1, -1)]:
            out += self.contacts(node, b).tolist()
            if len(out) >= self.k:
                break
        return out

    def lookup(self, src: int, target: int, alpha: int = 3) -> tuple[int, int]:
        """(requests sent, rounds) of an iterative lookup of id `target` from node `src`."""
        tid = int(target)

        def dist(i: int) -> int:
            return int(self.ids[i]) ^ tid

        known = set(self.closest_known(src, tid))
        queried: set[int] = {src}
        best = min((dist(x) for x in known), default=dist(src))
        requests = rounds = 0
        while True:
            todo = sorted((x for x in known if x not in queried), key=dist)[:alpha]
            if not todo:
                break
            rounds += 1
            improved = False
            for x in todo:
                queried.add(x)
                requests += 1
                for y in self.closest_known(x, tid):
                    if y not in known:
                        known.add(y)
                        if dist(y) < best:
                            best, improved = dist(y), True
            if not improved and all(x in queried for x in sorted(known, key=dist)[: self.k]):
                break
        return requests, rounds


def measure(
    n: int, rng: np.random.Generator, cfg: DhtConfig | None = None, lookups: int = 200
) -> dict[str, float]:
    """Mean requests and rounds per lookup at `n` nodes, and the messages per peer per minute."""
    cfg = cfg or DhtConfig()
    dht = Kademlia(n, rng, cfg.k)
    reqs, rounds = [], []
    for _ in range(lookups):
        src = int(rng.integers(0, dht.n))
        target = int(rng.integers(0, 2**63 - 1))
        r, h = dht.lookup(src, target, cfg.alpha)
        reqs.append(r)
        rounds.append(h)
    per_lookup = float(np.mean(reqs))
    per_min = 60.0 / cfg.refresh_s + 60.0 / cfg.link_report_s
    issued = per_min * (per_lookup + cfg.k) + 60.0 / cfg.bucket_refresh_s * per_lookup
    return {
        "peers": float(n),
        "requests_per_lookup": per_lookup,
        "rounds_per_lookup": float(np.mean(rounds)),
        "messages_per_peer_per_min": 4.0 * issued,  # request + response, sent + received
        "coordinator_reads_per_poll": float(n),
    }
