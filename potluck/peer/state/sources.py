"""Where a run gets its start state (the worker asks before each run of a plan)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from potluck.net.streams import Streams
from potluck.peer.state.source import DiskSource, Holder, LocalSource, PeerSource, StateSource
from potluck.protocol.training import TrainPlan
from potluck.transfer.server import StateServer


def start_sources(
    plan: TrainPlan,
    recent: Sequence[TrainPlan],
    root: Path,
    server: StateServer,
    streams: Streams,
    swarm_id: str,
    me: str,
    owner: str | None,
) -> list[StateSource]:
    """This peer's copy, its disk (``root``), then live holders (the peers of ``recent`` plans, by the
    layers they ran) and checkpoint copies (any peer of these plans, and the job ``owner``'s copy on the
    coordinator); copies first when the plan resumes from a checkpoint.

    A peer holds the layers of the last run it actually started, which is not always the previous
    plan's (a plan can fail before anyone takes state), so every recent plan's assignment is a
    candidate, and so is every holder the plan names (``TrainPlan.holders``: what the peers reported
    holding, older layer cuts' pieces included); a candidate that does not hold what it is asked for
    says so and the others serve."""
    sources: list[StateSource] = [LocalSource(held) for held in server.offered_all] or [LocalSource(None)]
    sources.append(DiskSource(root))
    by_plans = {Holder(p, a.first_layer, a.last_layer) for old in recent for a in old.stages for p in a.peers}
    named = {Holder(h.peer_id, h.first_layer, h.last_layer) for h in plan.holders}  # the coordinator's view
    holders = sorted(
        (h for h in by_plans | named if h.peer_id != me), key=lambda h: (h.first, h.last, h.peer_id)
    )
    remote: list[StateSource] = []
    if holders:
        remote.append(PeerSource(streams, swarm_id, holders, server.cfg, local=server.offered_all))
    # Checkpoint copies can be on any peer (a replica's own disk, a one-replica stage's copy holder)
    # or the owner; asked once (no settling: a disk either has the step or does not).
    keepers = {p for old in [*recent, plan] for a in old.stages for p in a.peers} | {owner}
    keepers -= {me, None}
    if keepers:
        everything = [Holder(p, 0, plan.n_layers) for p in sorted(k for k in keepers if k)]
        once = dataclasses.replace(server.cfg, settle_s=0.0)
        remote.append(PeerSource(streams, swarm_id, everything, once))
    if plan.resume_from == "checkpoint":
        remote.reverse()
    return sources + remote
