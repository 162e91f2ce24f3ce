"""From replicas' testimony to bans: which peers' contributions the other replicas keep refusing.

On a one-hop schedule every replica of a stage owns a shard and aggregates every other replica's slice
of it, so each one witnesses each other's contributions independently (``Progress.witnessed``: chunks
seen, chunks refused as NaN/Inf or clipped as far outliers, signed by the witness). A peer is found
hostile when more than ``quorum`` of its stage's *other* replicas, and at least two, each saw at least
``min_seen`` of its chunks and found at least ``rate`` of them outlying. A minority of hostile replicas
therefore cannot get an honest one banned by lying about it, and an honest replica's occasional clipped
chunk (noise) stays far below ``rate``.

Where the replicas recompute the steps of the peers their rule found outlying
(``peer/train/checks/recheck.py``, a stage holding the whole model), outlying testimony is only the
suspicion and the recomputation the verdict: a peer is convicted by failed checks alone, so an honest
peer with unusual gradients is clipped but never banned.

Pipeline spot checks (``peer/train/checks/spot.py``) testify the same way: a witness that recomputed one
of the peer's micro-batches and got another result names it (``Witness.failed``). An honest peer never
fails a check (the tolerance covers the codec and numerics), so one failed check counts; conviction again
needs more than ``quorum`` of the stage's other replicas, and at least two, each to have caught it: the
check is confirmed by recomputation on another replica. Audits of shard owners
(``peer/train/checks/audit.py``) testify alike; an owner that withheld the evidence of its aggregation at
``withheld_steps`` or more steps counts as caught too (a crash withholds at most one step's evidence).
Pure: records in, verdicts out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from potluck.protocol.training import Progress, TrainPlan


@dataclass(frozen=True)
class AccuseConfig:
    min_seen: int = 8  # chunks a witness must have aggregated before its word counts
    rate: float = 0.5  # share of them it found outlying
    quorum: float = 0.5  # share of the other replicas that must say so (strictly more than)
    withheld_steps: int = 2  # steps at which an owner withheld its audits' evidence, for a witness


def hostile_peers(
    plan: TrainPlan, records: Iterable[Progress], cfg: AccuseConfig, rechecked: Collection[int] = ()
) -> list[tuple[str, str]]:
    """(peer, reason) for each placed peer its stage's replicas convict; sorted by peer. ``rechecked``:
    the stages whose replicas confirm outlying contributions by recomputation
    (``protocol.training.gradients_rechecked``); there outlying testimony alone convicts nobody."""
    testimony: dict[str, dict[str, tuple[int, int]]] = {}  # accused -> witness -> (seen, outlying)
    caught: dict[str, set[str]] = {}  # accused -> witnesses whose spot checks it failed
    for r in records:
        if r.epoch != plan.epoch or r.job != plan.job:
            continue
        for w in r.witnessed:
            testimony.setdefault(w.peer_id, {})[r.peer_id] = (w.seen, w.outlying)
            if w.failed > 0 or w.withheld >= cfg.withheld_steps:
                caught.setdefault(w.peer_id, set()).add(r.peer_id)
    out = []
    for j, stage in enumerate(plan.stages):
        others = len(stage.peers) - 1
        if others < 2:
            continue
        for peer in stage.peers:
            said = testimony.get(peer, {})
            accusers = [
                w
                for w, (seen, bad) in said.items()
                if w in stage.peers and w != peer and seen >= cfg.min_seen and bad >= cfg.rate * seen
            ]
            checkers = [w for w in caught.get(peer, ()) if w in stage.peers and w != peer]
            if j not in rechecked and len(accusers) >= 2 and len(accusers) > cfg.quorum * others:
                why = f"{len(accusers)} of its {others} fellow replicas refused or clipped its gradients"
                out.append((peer, why))
            elif len(checkers) >= 2 and len(checkers) > cfg.quorum * others:
                why = f"{len(checkers)} of its {others} fellow replicas recomputed its work otherwise"
                out.append((peer, why))
    return sorted(out)
