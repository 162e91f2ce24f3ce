"""The step commit: every peer of the plan applies step s, or none does.

After its gradients are final (pipeline done, replicas all-reduced), each peer sends READY to the
plan's leader with what the leader needs to finish the step: its stage's squared gradient norm (the
global clipping norm is the root of the sum over stages) and, on the last stage, its share of the loss.
The leader waits for every peer of the plan, then sends the same COMMIT (global norms per replica and
the batch loss) to all, or ABORT to all if someone failed, reported trouble, or missed the deadline.
A peer steps only on COMMIT; on ABORT, or without a decision in time, it drops the step's gradients.

Under ``sync.policy = "deadline"`` (``straggle.py``) a replica left out of its stage's all-reduce sends
no READY: the contributors name the stage's members (replica indices) in theirs, the leader waits for
exactly those, uses their (identical) squared norm for every replica of the stage and renormalises the
loss over the last stage's contributors; the left-out replica still receives the COMMIT or ABORT.

A leader that dies after some COMMITs left is the gap two-phase commit leaves: a peer whose wait for the
decision fails asks the others for the leader's signed decision before it gives the step up
(``termination.py``), so the survivors apply the step together or drop it together.
Messages are small JSON objects, size-capped and schema-checked before use.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from potluck.net.tags import Round, Stream, make_tag
from potluck.peer.collectives.rounds import Replies, announce, collect
from potluck.peer.errors import StepAborted
from potluck.peer.train.termination import MAX_ABORT_BYTES, Decisions
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
    # Replicas whose gradients this stage's all-reduce averaged (deadline policy); None: all of them.
    members: tuple[int, ...] | None = None


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


def _parse_ready(data: bytes, who: str, expect: tuple[int, int], n_replicas: int = 1 << 16) -> Ready:
    """A peer's READY, checked: JSON object, fields and types, the claimed position, members in range."""
    obj = _loads(data, who)
    try:
        members = obj.get("members")
        ready = Ready(
            int(obj["stage"]),
            int(obj["replica"]),
            float(obj["sq_norm"]),
            float(obj["loss"]),
            bool(obj["ok"]),
            str(obj.get("reason", ""))[:200],
            None if members is None else tuple(int(r) for r in members[:n_replicas]),
        )
    except (KeyError, TypeError, ValueError):
        raise WireError(f"READY from {who} lacks fields or has wrong types") from None
    if (ready.stage, ready.replica) != expect:
        raise WireError(
            f"READY from {who} claims stage/replica {(ready.stage, ready.replica)}, plan says {expect}"
        )
    if ready.members is not None and (
        ready.replica not in ready.members or any(not 0 <= r < n_replicas for r in ready.members)
    ):
        raise WireError(f"READY from {who} names members {ready.members} of {n_replicas} replicas")
    return finite(ready, who)


def finite(ready: Ready, who: str) -> Ready:
    """``ready``, or a failed READY where its norm or loss is not finite: such a step cannot commit, and
    the leader's ABORT then says why (a READY with Inf in it cannot even be written as JSON)."""
    if not (math.isfinite(ready.sq_norm) and ready.sq_norm >= 0 and math.isfinite(ready.loss)):
        return Ready(ready.stage, ready.replica, 0.0, 0.0, False, f"non-finite gradients or loss at {who}")
    return ready


def _members(plan: TrainPlan, readies: dict[str, Ready], stage: int) -> list[str]:
    """Pure: the peers of ``stage`` whose READY the leader needs: the members its READYs name (the
    deadline policy), else every replica."""
    named = {r.members for p in plan.stages[stage].peers if (r := readies.get(p)) is not None and r.ok}
    named.discard(None)
    if len(named) != 1:  # none named (strict), or disagreement, which _decide turns into an abort
        return list(plan.stages[stage].peers)
    (members,) = named
    assert members is not None
    return [p for i, p in enumerate(plan.stages[stage].peers) if i in members]


def _complete(plan: TrainPlan, readies: dict[str, Ready]) -> bool:
    """Pure: whether the leader holds every READY it needs to decide."""
    return all(p in readies for j in range(len(plan.stages)) for p in _members(plan, readies, j))


def _decide(plan: TrainPlan, readies: dict[str, Ready]) -> Decision:
    """Pure: the leader's decision from the READYs it holds."""
    missing = [p for j in range(len(plan.stages)) for p in _members(plan, readies, j) if p not in readies]
    bad = [f"{p}: {r.reason}" for p, r in readies.items() if not r.ok]
    for j, st in enumerate(plan.stages):
        named = {r.members for p in st.peers if (r := readies.get(p)) is not None and r.ok}
        if len(named) > 1:
            bad.append(f"stage {j}: replicas disagree on the all-reduce's members {sorted(map(str, named))}")
    if missing or bad:
        why = f"peers reported failure: {bad}" if bad else f"missing READY from {missing}"
        return Decision(False, (), 0.0, why)
    sq = [0.0] * plan.n_replicas
    loss, last = 0.0, len(plan.stages) - 1
    for j, st in enumerate(plan.stages):
        got = [readies[p] for p in st.peers if p in readies]
        for i, p in enumerate(st.peers):
            # A left-out replica applies its stage's committed mean: the contributors' gradients.
            sq[i] += (readies.get(p) or got[0]).sq_norm
        if j == last:
            loss = sum(r.loss for r in got)
            if len(got) < plan.n_replicas:  # shares of the contributors' sequences only: renormalise
                loss *= plan.n_replicas / len(got)
    return Decision(True, tuple(math.sqrt(s) for s in sq), loss)


async def commit_step(decisions: Decisions, rnd: Round, ready: Ready | None, timeout_s: float) -> Decision:
    """Run the commit for one step; returns the COMMIT decision or raises ``StepAborted``. ``ready`` is
    None for a replica left out of its stage's all-reduce: it votes nothing and learns the decision."""
    box, plan = decisions.box, decisions.plan
    me, leader = box.peer_id, plan.leader
    ready = finite(ready, me) if ready is not None else None
    peers = [p for st in plan.stages for p in st.peers]
    tag_ready, tag_decision = make_tag(rnd, Stream.COMMIT_READY), make_tag(rnd, Stream.COMMIT_DECISION)
    if me == leader:
        readies = {me: ready} if ready is not None else {}

        def parse(peer: str, data: bytes) -> Ready:
            return _parse_ready(data, peer, plan.position(peer) or (-1, -1), plan.n_replicas)

        # until every READY the decision needs is in (left-out replicas send none), or one says the step
        # failed: then it cannot commit, and the peers still at work on it are told at once below
        others = [p for p in peers if p != me]

        def enough(r: Replies[Ready]) -> bool:
            both = {**readies, **r.got}
            return _complete(plan, both) or any(not x.ok for x in both.values())

        got = await collect(box, others, tag_ready, timeout_s, parse, enough)
        for why in got.failed.values():
            logger.warning("step commit: %s", why)
        readies |= got.got
        decision = _decide(plan, readies)
        body = _dumps(
            {
                "committed": decision.committed,
                "norms": list(decision.norms),
                "loss": decision.loss,
                "reason": decision.reason,
            }
        )
        if not decision.committed:  # peers still waiting on one another for this step stop now
            told = decision.reason.encode()[:MAX_ABORT_BYTES]
            await announce(box, others, make_tag(rnd, Stream.STEP_ABORT), told, "step abort")
        sealed = decisions.seal(rnd, body)
        await announce(box, others, tag_decision, sealed, "step commit: decision", logging.WARNING)
    else:
        decision = await _learn(decisions, rnd, ready, timeout_s)
    if not decision.committed:
        raise StepAborted(f"step aborted by the leader: {decision.reason}")
    return decision


async def _learn(decisions: Decisions, rnd: Round, ready: Ready | None, timeout_s: float) -> Decision:
    """A peer's side: READY to the leader, then its decision; when none comes, the one another peer got."""
    box, plan, leader = decisions.box, decisions.plan, decisions.plan.leader
    decisions.waiting(rnd)  # from here on, a question about ``rnd`` waits for this wait's end
    sealed: bytes | None = None
    try:
        if ready is not None:
            await box.send(leader, make_tag(rnd, Stream.COMMIT_READY), _dumps(ready.__dict__))
        sealed = await box.recv(leader, make_tag(rnd, Stream.COMMIT_DECISION), timeout_s)
        body = decisions.open(rnd, sealed, leader)
    except WireError as e:
        sealed = None  # what came, if anything, is not the leader's decision
        decisions.settle(rnd, None)
        relayed = await decisions.ask(rnd, timeout_s)
        if relayed is None:
            raise StepAborted(
                f"no commit decision from the leader {leader}: {e}; no other peer got one"
            ) from None
        body = relayed
    finally:
        decisions.settle(rnd, sealed)
    try:
        obj = _loads(body, leader)
        norms = tuple(float(x) for x in obj["norms"])
        decision = Decision(bool(obj["committed"]), norms, float(obj["loss"]), str(obj.get("reason", "")))
    except (WireError, KeyError, TypeError, ValueError) as e:
        raise StepAborted(f"no commit decision from the leader {leader}: {e}") from None
    if decision.committed and len(decision.norms) != plan.n_replicas:
        raise StepAborted(f"leader sent {len(decision.norms)} norms for {plan.n_replicas} replicas")
    return decision
