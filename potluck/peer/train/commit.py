"""The step commit: every peer of the plan applies step s, or none does.

After its gradients are final (pipeline done, replicas all-reduced), each peer sends READY to the
plan's leader with what the leader needs to finish the step: its stage's squared gradient norm (the
global clipping norm is the root of the sum over stages) and, on the last stage, its share of the loss.
The leader waits for every peer of the plan, then sends the same COMMIT (global norms per replica and
the batch loss) to all, or ABORT to all if someone failed, reported trouble, or missed the deadline.
A peer steps only on COMMIT; on ABORT, or without a decision in time, it drops the step's gradients.

A leader that dies after some COMMITs left is the one gap two-phase commit cannot close; the
coordinator closes it from outside by restarting every peer from the last complete checkpoint.
Messages are small JSON objects, size-capped and schema-checked before use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, make_tag
from potluck.peer.errors import StepAborted
from potluck.protocol.errors import WireError
from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Ready:
    stage: int
    replica: int
    sq_norm: float  # squared L2 norm of this stage's (synchronised) gradients
    loss: float  # this replica's share of the batch loss (last stage), else 0
    ok: bool = True
    reason: str = ""


@dataclass(frozen=True)
class Decision:
    committed: bool
    norms: tuple[float, ...]  # global gradient norm per replica (pipeline)
    loss: float  # mean loss of the global batch
    reason: str = ""


def _dumps(obj: dict[str, object]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


def _loads(data: bytes, who: str) -> dict[str, Any]:
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"commit message from {who} is {len(data)} bytes (limit {MAX_MESSAGE_BYTES})")
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise WireError(f"commit message from {who} is not JSON") from None
    if not isinstance(obj, dict):
        raise WireError(f"commit message from {who} is not an object")
    return obj


def _parse_ready(data: bytes, who: str, expect: tuple[int, int]) -> Ready:
    obj = _loads(data, who)
    try:
        ready = Ready(
            int(obj["stage"]),
            int(obj["replica"]),
            float(obj["sq_norm"]),
            float(obj["loss"]),
            bool(obj["ok"]),
            str(obj.get("reason", ""))[:200],
        )
    except (KeyError, TypeError, ValueError):
        raise WireError(f"READY from {who} lacks fields or has wrong types") from None
    if (ready.stage, ready.replica) != expect:
        raise WireError(
            f"READY from {who} claims stage/replica {(ready.stage, ready.replica)}, plan says {expect}"
        )
    if not (math.isfinite(ready.sq_norm) and ready.sq_norm >= 0 and math.isfinite(ready.loss)):
        return Ready(ready.stage, ready.replica, 0.0, 0.0, False, f"non-finite gradients or loss at {who}")
    return ready


def _decide(plan: TrainPlan, readies: dict[str, Ready]) -> Decision:
    """Pure: the leader's decision from every peer's READY."""
    missing = [p for st in plan.stages for p in st.peers if p not in readies]
    bad = [f"{p}: {r.reason}" for p, r in readies.items() if not r.ok]
    if missing or bad:
        why = f"missing READY from {missing}" if missing else f"peers reported failure: {bad}"
        return Decision(False, (), 0.0, why)
    sq = [0.0] * plan.n_replicas
    loss = 0.0
    for r in readies.values():
        sq[r.replica] += r.sq_norm
        if r.stage == len(plan.stages) - 1:
            loss += r.loss
    return Decision(True, tuple(math.sqrt(s) for s in sq), loss)


async def commit_step(box: Mailbox, plan: TrainPlan, rnd: Round, ready: Ready, timeout_s: float) -> Decision:
    """Run the commit for one step; returns the COMMIT decision or raises ``StepAborted``."""
    me, leader = box.peer_id, plan.leader
    peers = [p for st in plan.stages for p in st.peers]
    tag_ready, tag_decision = make_tag(rnd, Stream.COMMIT_READY), make_tag(rnd, Stream.COMMIT_DECISION)
    if me == leader:
        readies = {me: ready}

        async def collect(peer: str, where: tuple[int, int]) -> None:
            try:
                readies[peer] = _parse_ready(await box.recv(peer, tag_ready, timeout_s), peer, where)
            except WireError as e:
                logger.warning("step commit: %s", e)

        await asyncio.gather(*(collect(p, plan.position(p) or (-1, -1)) for p in peers if p != me))
        decision = _decide(plan, readies)
        payload = _dumps(
            {
                "committed": decision.committed,
                "norms": list(decision.norms),
                "loss": decision.loss,
                "reason": decision.reason,
            }
        )
        results = await asyncio.gather(
            *(box.send(p, tag_decision, payload) for p in peers if p != me), return_exceptions=True
        )
        for p, res in zip([p for p in peers if p != me], results, strict=True):
            if isinstance(res, BaseException):
                logger.warning("step commit: decision not delivered to %s: %s", p, res)
    else:
        try:
            await box.send(leader, tag_ready, _dumps(ready.__dict__))
            obj = _loads(await box.recv(leader, tag_decision, timeout_s), leader)
            norms = tuple(float(x) for x in obj["norms"])
            decision = Decision(bool(obj["committed"]), norms, float(obj["loss"]), str(obj.get("reason", "")))
        except (WireError, KeyError, TypeError, ValueError) as e:
            raise StepAborted(f"no commit decision from the leader {leader}: {e}") from None
        if decision.committed and len(decision.norms) != plan.n_replicas:
            raise StepAborted(f"leader sent {len(decision.norms)} norms for {plan.n_replicas} replicas")
    if not decision.committed:
        raise StepAborted(f"step aborted by the leader: {decision.reason}")
    return decision
