"""What a coordinator remembers of its swarm across restarts: one small JSON file per swarm by its key.

Why: peers joined through the coordinator's address, and a restarted coordinator listens on a new port
unless it was given a fixed one; nobody would know where to find the others. So the coordinator keeps the
addresses its peers announce in their signed heartbeats, the plan it last published (which outlives the
plan record's 300 s TTL in the DHT) and whether the job finished. On restart it joins the swarm through
those peers and carries on (``job.recover``), and ``potluck launch`` without ``--swarm-id`` picks the
swarm of the job's unfinished run again.

Layout: ``<key dir>/<key stem>.swarms/<swarm id>.json``, e.g.
``~/.potluck/coordinator.swarms/tiny-3fa2c1.json``.
The file holds no secret; an unreadable one is ignored with a warning, never fatal.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import ValidationError

from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)

MAX_PEERS = 32  # peers remembered, most recently seen first: enough to find one still online
MAX_ADDRS = 4  # addresses kept per peer (a peer announces at most 16)
VERSION = 1


@dataclass(frozen=True)
class SwarmMemory:
    swarm_id: str
    job: str
    peers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # peer id -> its /p2p/ addresses
    seen: dict[str, float] = field(default_factory=dict)  # peer id -> unix time it was last seen live
    plan: TrainPlan | None = None  # the newest plan this coordinator published
    finished: bool = False  # the job ended (done or given up): a plain relaunch starts a new swarm


def memory_path(identity_path: Path, swarm_id: str) -> Path:
    return identity_path.parent / f"{identity_path.stem}.swarms" / f"{swarm_id}.json"


def remember_peers(
    memory: SwarmMemory, live: Iterable[tuple[str, Iterable[str]]], now: float, own_id: str = ""
) -> SwarmMemory:
    """``memory`` with the live peers' (peer id, announced addresses) merged in at time ``now``; keeps
    the ``MAX_PEERS`` seen last. Only addresses that name their peer (``/p2p/<id>``) can bootstrap."""
    peers, seen = dict(memory.peers), dict(memory.seen)
    for peer_id, addrs in live:
        usable = tuple(a for a in addrs if a.endswith(f"/p2p/{peer_id}"))[:MAX_ADDRS]
        if peer_id != own_id and usable:
            peers[peer_id], seen[peer_id] = usable, now
    keep = sorted(peers, key=lambda p: seen.get(p, 0.0), reverse=True)[:MAX_PEERS]
    return replace(memory, peers={p: peers[p] for p in keep}, seen={p: seen.get(p, 0.0) for p in keep})


def updated(
    old: SwarmMemory | None,
    swarm_id: str,
    job: str,
    live: Iterable[tuple[str, Iterable[str]]],
    plan: TrainPlan | None,
    finished: bool,
    now: float,
    own_id: str = "",
) -> tuple[SwarmMemory, bool]:
    """The memory to keep now, and whether it differs from ``old`` in more than last-seen times."""
    base = old if old is not None and old.swarm_id == swarm_id else SwarmMemory(swarm_id, job)
    new = replace(remember_peers(base, live, now, own_id), job=job, plan=plan, finished=finished)
    same = old is not None and (new.job, new.peers, new.plan, new.finished) == (
        old.job,
        old.peers,
        old.plan,
        old.finished,
    )
    return new, not same


def bootstrap_addresses(memory: SwarmMemory | None) -> tuple[str, ...]:
    """Every remembered address, the peers seen last first."""
    if memory is None:
        return ()
    order = sorted(memory.peers, key=lambda p: memory.seen.get(p, 0.0), reverse=True)
    return tuple(a for p in order for a in memory.peers[p])


def load_memory(path: Path) -> SwarmMemory | None:
    """The memory at ``path``; None when there is none or it cannot be read (logged)."""
    try:
        data = json.loads(path.read_text())
        plan = TrainPlan.model_validate(data["plan"]) if data.get("plan") is not None else None
        return SwarmMemory(
            swarm_id=str(data["swarm_id"]),
            job=str(data["job"]),
            peers={str(p): tuple(str(a) for a in addrs) for p, addrs in data["peers"].items()},
            seen={str(p): float(t) for p, t in data["seen"].items()},
            plan=plan,
            finished=bool(data["finished"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ValidationError) as e:
        logger.warning("ignoring the swarm memory %s: %s", path, e)
        return None


def save_memory(path: Path, memory: SwarmMemory) -> None:
    """Write ``memory`` to ``path`` atomically (temporary file, fsync, rename)."""
    data = {
        "version": VERSION,
        "swarm_id": memory.swarm_id,
        "job": memory.job,
        "peers": {p: list(a) for p, a in memory.peers.items()},
        "seen": memory.seen,
        "plan": memory.plan.model_dump(mode="json") if memory.plan is not None else None,
        "finished": memory.finished,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def unfinished_swarm(identity_path: Path, job: str) -> str | None:
    """The swarm id of job ``job``'s newest unfinished run coordinated with this key, if any."""
    folder = identity_path.parent / f"{identity_path.stem}.swarms"
    found: list[tuple[float, str]] = []
    for path in folder.glob("*.json") if folder.is_dir() else ():
        memory = load_memory(path)
        if memory is not None and memory.job == job and not memory.finished:
            found.append((path.stat().st_mtime, memory.swarm_id))
    return max(found)[1] if found else None
