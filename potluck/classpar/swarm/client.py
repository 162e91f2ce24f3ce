"""The client half of class-parallel serving (``potluck serve``): join, read the plan, fan queries out.

``ServeClient.connect`` joins the swarm as a DHT client with a throwaway key, trades the invite's token
for an admission (holders serve admitted peers only), finds the job's keys and waits for its
``ClassParPlan`` to say "serving". ``query`` asks every coded worker's holder at once and decodes from
the first replies that determine every group (``classpar.fanout.first_decodable``); without parity it
needs every group's reply. A dead holder's stream fails and a hung one is cancelled: every wait is
bounded by the query's timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from potluck.aio import bounded
from potluck.classpar import merge
from potluck.classpar.code import ErasureCode
from potluck.classpar.errors import CodeError
from potluck.classpar.fanout import first_decodable
from potluck.classpar.recipe import make_code
from potluck.classpar.swarm.streams import ScoresRequest, ask_scores
from potluck.net.admit import ask_admission
from potluck.net.config import NetworkConfig
from potluck.net.dial import dht_addresses, reachable
from potluck.net.node import SwarmNode
from potluck.net.streams import Streams
from potluck.protocol.classpar import ClassParPlan
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.errors import RecordError
from potluck.protocol.identity import Identity, peer_id_from_public_key
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JOB, PEERS, JobKeys
from potluck.protocol.records import PeerRecord

logger = logging.getLogger(__name__)

PLAN_POLL_S = 1.0
PLAN_REFRESH_S = 10.0  # a long-running client reads the plan again at most this often, between queries
CHECK_RTOL, CHECK_ATOL = 1e-6, 1e-9  # two float64 decodings of honest replies differ by ~1e-13
# One coded worker's reply: a holder's (N, |g|) array, from (worker, images)
Ask = Callable[[int, np.ndarray], Awaitable[np.ndarray]]


@dataclass(frozen=True)
class Answer:
    scores: np.ndarray  # (N, K) float32, class order
    workers: list[int]  # the coded workers whose replies were decoded, in arrival order
    latency_s: float
    # With ``check``: whether two decodings from different replies agreed (None: too few replies to
    # tell), and the worker whose reply disagreed with all the others' (its reply was left out)
    consistent: bool | None = None
    suspect: int | None = None


def merge_groups(plan: ClassParPlan, blocks: Sequence[np.ndarray]) -> np.ndarray:
    """(N, K) float32 scores in class order from each group's (N, |g|) block (decoded: float64)."""
    tensors = [torch.from_numpy(np.asarray(b, dtype=np.float32)) for b in blocks]
    return merge.merge_scores(tensors, plan.groups).numpy()


async def answer(plan: ClassParPlan, ask: Ask, x: np.ndarray, timeout_s: float) -> Answer:
    """Ask every coded worker of ``plan`` for ``x`` and decode (the network is in ``ask``)."""
    started = time.monotonic()
    code = make_code(plan.code, len(plan.groups), plan.parity)
    if plan.parity == 0:  # uncoded: every group's reply, whatever their sizes
        tasks = [asyncio.ensure_future(ask(w, x)) for w in range(code.n)]
        try:
            blocks = await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)
        except Exception as e:
            raise CodeError(f"an uncoded group did not answer within {timeout_s} s: {e}") from None
        finally:
            for t in tasks:
                t.cancel()
        return Answer(merge_groups(plan, blocks), list(range(code.n)), time.monotonic() - started)
    decoded, used = await first_decodable(code, [ask(w, x) for w in range(code.n)], timeout_s=timeout_s)
    return Answer(merge_groups(plan, list(decoded)), used, time.monotonic() - started)


def _agree(
    code: ErasureCode, workers: list[int], replies: list[np.ndarray]
) -> tuple[np.ndarray, bool | None]:
    """The decoding from ``workers``' replies in order, and whether the one from the reverse order (other
    replies, where more than K came) agrees with it; None when both use the same replies."""
    stacked = np.stack(replies)
    first = code.decode(workers, stacked)
    if len(workers) <= code.k:
        return first, None
    last = code.decode(workers[::-1], stacked[::-1])
    return first, bool(np.allclose(first, last, rtol=CHECK_RTOL, atol=CHECK_ATOL))


def cross_check(
    code: ErasureCode, workers: list[int], replies: list[np.ndarray]
) -> tuple[np.ndarray, bool | None, int | None]:
    """Decode, and compare two decodings from different replies. When they disagree and leaving one
    worker's reply out makes the rest agree, that worker is the suspect and the answer comes without it
    (a single lying holder is found with r >= 2 and every reply in)."""
    first, ok = _agree(code, workers, replies)
    if ok is not False:
        return first, ok, None
    for j in range(len(workers)):
        rest = [w for i, w in enumerate(workers) if i != j]
        if not code.decodable(rest):
            continue
        decoded, agree = _agree(code, rest, [r for i, r in enumerate(replies) if i != j])
        if agree:
            return decoded, False, workers[j]
    return first, False, None


async def checked_answer(plan: ClassParPlan, ask: Ask, x: np.ndarray, timeout_s: float) -> Answer:
    """``answer`` that waits for every reply (``timeout_s`` at most) and cross-checks two decodings."""
    started = time.monotonic()
    code = make_code(plan.code, len(plan.groups), plan.parity)
    tasks = {asyncio.ensure_future(ask(w, x)): w for w in range(code.n)}
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for t in pending:
        t.cancel()
        logger.warning("worker %d did not answer within %s s", tasks[t], timeout_s)
    for t in done:
        if (e := t.exception()) is not None:
            logger.warning("worker %d did not answer: %s", tasks[t], e)
    ok = sorted((tasks[t], t.result()) for t in done if t.exception() is None)
    workers, replies = [w for w, _ in ok], [np.asarray(r, dtype=np.float64) for _, r in ok]
    if not code.decodable(workers):
        raise CodeError(f"only workers {workers} answered within {timeout_s} s: not enough to decode")
    decoded, consistent, suspect = cross_check(code, workers, replies)
    used = [w for w in workers if w != suspect]
    return Answer(merge_groups(plan, list(decoded)), used, time.monotonic() - started, consistent, suspect)


class ServeClient:
    def __init__(
        self, node: SwarmNode, swarm_id: str, keys: JobKeys, plan: ClassParPlan, timeout_s: float
    ) -> None:
        self.node, self.swarm_id, self.keys, self.plan = node, swarm_id, keys, plan
        self.timeout_s = timeout_s
        self.streams = Streams(node.p2p)
        self.streams.credentials = lambda: node.admission
        self._addresses = dht_addresses(node)
        self._qids = itertools.count(1)
        self._plan_read = time.monotonic()

    @classmethod
    async def connect(
        cls, invite: Invite, net: NetworkConfig, job: str, timeout_s: float, wait_s: float
    ) -> ServeClient:
        """Join, get admitted, and wait up to ``wait_s`` for ``job``'s plan to be serving."""
        net = dataclasses.replace(net, host_maddrs=("/ip4/127.0.0.1/tcp/0",), announce_maddrs=())
        policy = TrustPolicy(invite.swarm_id, invite.coordinator_key, require_admission=True)
        node = await SwarmNode.start(Identity.generate(), policy, net, invite.bootstrap, client_mode=True)
        try:
            coordinator = peer_id_from_public_key(invite.coordinator_key)
            adm = await ask_admission(
                Streams(node.p2p), coordinator, invite.swarm_id, invite.token, timeout_s
            )
            node.admission = adm.encode()
            keys = await bounded(_job_keys(node, job), timeout_s, "reading the job")
            plan = await _serving_plan(node, keys, job, wait_s, timeout_s)
            client = cls(node, invite.swarm_id, keys, plan, timeout_s)
            await client.meet_holders()
        except BaseException:
            await node.shutdown()
            raise
        return client

    async def meet_holders(self) -> None:
        """Connect to every holder at its announced addresses, so the first query does not pay the dials."""
        found = await bounded(self.node.fetch(PEERS.name), self.timeout_s, "reading the peers")
        maddrs = {v.record.peer_id: v.record.maddrs for v in found if isinstance(v.record, PeerRecord)}
        holders = sorted(self.plan.holders)
        await asyncio.gather(
            *(reachable(self.node.p2p, p, maddrs.get(p, []), self.timeout_s) for p in holders)
        )

    async def _ask(self, worker: int, x: np.ndarray, qid: int) -> np.ndarray:
        req = ScoresRequest(self.plan.job, worker, qid, x)
        peer = self.plan.workers[worker]
        return await ask_scores(self.streams, peer, self.swarm_id, req, self.timeout_s, self._addresses)

    async def refresh(self) -> bool:
        """Read the plan again when it is older than ``PLAN_REFRESH_S`` and take a newer serving epoch (a
        lost holder's workers dealt to other peers); True when it changed. A failed read keeps the plan."""
        if time.monotonic() - self._plan_read < PLAN_REFRESH_S:
            return False
        self._plan_read = time.monotonic()
        try:
            newest = await bounded(
                _newest_plan(self.node, self.keys, self.plan.job), self.timeout_s, "the plan"
            )
        except Exception as e:  # the plan in hand still answers while parities cover its losses
            logger.info("plan not read again: %s", e)
            return False
        if newest is None or newest.status != "serving" or newest.epoch <= self.plan.epoch:
            return False
        logger.info("plan epoch %d -> %d: workers %s", self.plan.epoch, newest.epoch, newest.workers)
        self.plan = newest
        try:
            await self.meet_holders()
        except Exception as e:  # the first queries pay the dials instead
            logger.info("holders not met: %s", e)
        return True

    async def query(self, x: np.ndarray, check: bool = False) -> Answer:
        """The merged (N, K) scores of images ``x`` (N, 1, H, W); ``check``: wait for every reply and
        cross-check two decodings (``checked_answer``). Follows a newer serving plan (``refresh``)."""
        await self.refresh()
        qid = next(self._qids)
        run = checked_answer if check and self.plan.parity > 0 else answer
        return await run(self.plan, lambda w, xs: self._ask(w, xs, qid), x, self.timeout_s)

    async def close(self) -> None:
        await self.node.shutdown()


async def _job_keys(node: SwarmNode, job: str) -> JobKeys:
    """The swarm's own job's keys when it is ``job``, else ``job``'s job-scoped ones."""
    home = [v.record for v in await node.fetch(JOB.name) if isinstance(v.record, JobSpec)]
    if any(j.name == job for j in home):
        return JobKeys(job, home=True)
    return JobKeys(job, home=False)


async def _newest_plan(node: SwarmNode, keys: JobKeys, job: str) -> ClassParPlan | None:
    found = await node.fetch(keys.classpar)
    plans = [v.record for v in found if isinstance(v.record, ClassParPlan) and v.record.job == job]
    return max(plans, key=lambda p: (p.epoch, p.status == "serving"), default=None)


async def _serving_plan(
    node: SwarmNode, keys: JobKeys, job: str, wait_s: float, timeout_s: float
) -> ClassParPlan:
    deadline = time.monotonic() + wait_s
    seen = "no class-parallel plan"
    while True:
        plan = await bounded(_newest_plan(node, keys, job), timeout_s, "reading the plan")
        if plan is not None and plan.status == "serving":
            return plan
        if plan is not None:
            seen = f"plan epoch {plan.epoch} is {plan.status}"
        if time.monotonic() >= deadline:
            raise RecordError(f"job {job!r} is not serving within {wait_s:.0f} s: {seen}")
        await asyncio.sleep(PLAN_POLL_S)
