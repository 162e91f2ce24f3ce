"""The deadline sync policy (job ``sync.policy = "deadline"``): a stage's replicas average their gradients
over the replicas ready in time; a replica left out catches up by applying the committed mean.

Step s on a stage with R > 1 replicas, after the pipeline:
1. each replica flattens its whole gradient (error feedback at the source, as the strict path does) and
   enters ``relaxed_allreduce`` under ``Round(e, s).bucket(0)``. The stage's round leader (replica 0)
   waits ``deadline_s`` after its own gradients are ready; the replicas ready by then average theirs and
   commit the result together, all or nothing. One all-reduce of the flat gradient after the backward:
   no overlap with the backward as in the strict path's buckets.
2. a contributor sets its gradients to R x the mean over its k contributors (the strict path's sum over
   R replicas, renormalised) and names the members in its commit READY (``commit.py``);
3. the round leader sends the mean, lossless, to every replica left out (``Stream.CATCHUP``);
4. a left-out replica votes nothing in the commit, receives the same COMMIT as everyone, sets its
   gradients from the leader's mean through the same code as the contributors, and steps with the same
   clip coefficient and learning rate. Same state + same update = the same parameters and AdamW moments,
   bit for bit, on every replica. A replica that is behind finds the decision and the mean waiting in its
   mailbox; it still computes each step (its pipeline neighbours expect it), so it catches up as long as
   it is faster than the others' compute time + deadline, and reports itself failed (``StragglerError``)
   after ``sync.max_misses`` misses in a row. The round leader reports a replica that missed that many
   rounds of its own in a row as well (a dead replica never reports itself).

Deadline: ``deadline_s`` (pure) from the leader's recent compute times (step start -> gradients ready,
so the deadline waits themselves do not feed back into it). Limitation: the round leader and the step
commit's leader (replica 0) are never left out; when one of them straggles, its group waits as under
``strict``.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections import deque
from collections.abc import Sequence

import torch

from potluck.compression import CompressionError, ErrorFeedback, decode, get_codec
from potluck.model.stage import StageRunner
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, Tag, make_tag
from potluck.peer.collectives.relaxed import relaxed_allreduce
from potluck.peer.collectives.robust import Audit
from potluck.peer.config import AllReduceConfig, RelaxedConfig
from potluck.peer.errors import CollectiveError, LateError, StragglerError
from potluck.protocol.collective import AllReduceSchedule
from potluck.protocol.errors import WireError
from potluck.protocol.jobspec import SyncSpec

logger = logging.getLogger(__name__)

WINDOW = 16  # recent compute times the deadline's median is taken over (steps)


def deadline_s(samples: Sequence[float], factor: float, floor_s: float, cap_s: float) -> float:
    """Pure: how long the round leader waits for the others once its own gradients are ready.

    ``factor`` x the median of ``samples`` (its recent compute times, seconds), at least ``floor_s``, at
    most ``cap_s`` (the step's timeout). No samples yet (a run's first step, when peers start at
    different times after fetching state): ``cap_s``, so nobody is left out of it."""
    if not samples:
        return cap_s
    return min(cap_s, max(floor_s, factor * statistics.median(samples)))


class DeadlineSync:
    """One stage replica's side of the deadline policy; ``replica`` indexes ``schedule.peers``."""

    def __init__(
        self,
        runner: StageRunner,
        box: Mailbox,
        schedule: AllReduceSchedule,
        cfg: AllReduceConfig,
        spec: SyncSpec,
        error_feedback: bool,
        audit: Audit | None = None,
    ) -> None:
        self.runner, self.box, self.schedule, self.cfg, self.spec = runner, box, schedule, cfg, spec
        self.audit = audit
        self.peers = list(schedule.peers)
        self.leader = self.peers[0]
        self.feedback = ErrorFeedback() if error_feedback else None
        self._codec = get_codec(cfg.codec)
        self._lossless = get_codec("none")
        self.samples: deque[float] = deque(maxlen=WINDOW)  # this replica's recent compute times (s)
        self.misses = 0  # rounds in a row this replica was left out of
        self.left_out = 0  # rounds this replica was left out of in this run
        self.missed_by = [0] * len(self.peers)  # leader: rounds in a row each replica was left out of
        self._sends: set[asyncio.Task[None]] = set()

    async def reduce(self, rnd: Round, compute_s: float, cap_s: float) -> tuple[int, ...]:
        """Average this step's gradients over the replicas ready in time and write R x the mean into
        them; returns the members (replica indices). Raises ``LateError`` when left out."""
        wait_s = deadline_s(self.samples, self.spec.deadline_factor, self.spec.min_deadline_s, cap_s)
        self.samples.append(compute_s)  # after: a run's first step waits for everyone (no samples yet)
        flat = self.runner.grad_vector()
        if flat.device.type != "cpu":  # the relaxed all-reduce codes and sends host tensors
            flat = await asyncio.to_thread(flat.cpu)
        round_no = rnd.bucket(0)
        if self.feedback is not None:  # send what the codec keeps, carry the rest (as BucketSync)
            flat = decode(self._codec.encode(flat, key=(round_no.pack(), 0, 0), state=self.feedback))
        relax = RelaxedConfig(deadline_s=wait_s)
        try:
            mean, members = await relaxed_allreduce(
                self.box, self.schedule, flat, round_no, self.cfg, relax, self.audit
            )
        except LateError:
            self.misses += 1
            self.left_out += 1
            raise
        self.misses = 0
        self._apply(mean)
        idx = tuple(self.peers.index(p) for p in members)
        if self.box.peer_id == self.leader:
            self._note_members(idx)
            payload = self._lossless.encode(mean, key=(round_no.pack(), 0, 0))
            for p in self.peers:
                if p not in members:
                    self._start_send(p, make_tag(rnd, Stream.CATCHUP), payload)
        return idx

    async def catch_up(self, rnd: Round, timeout_s: float) -> None:
        """A left-out replica: take the committed mean of step ``rnd`` from the round leader."""
        try:
            data = await self.box.recv(self.leader, make_tag(rnd, Stream.CATCHUP), timeout_s)
            self._apply(self._lossless.decode(data, expect=(self.runner.grad_vector_len,)))
        except (WireError, CompressionError, ValueError) as e:
            raise CollectiveError(f"round {rnd}: no committed mean from {self.leader}: {e}") from None
        logger.info("left out of step %d (%d in a row): applied the committed mean", rnd.step, self.misses)

    def check(self) -> None:
        """After a step: raise ``StragglerError`` when this replica, or (on the leader) another, missed
        ``max_misses`` rounds in a row."""
        limit = self.spec.max_misses
        if self.misses >= limit:
            raise StragglerError(f"left out of {self.misses} steps in a row (sync.max_misses = {limit})")
        for i, n in enumerate(self.missed_by):
            if n >= limit:
                self.box.suspect(self.peers[i])
                raise StragglerError(f"replica {i} ({self.peers[i]}) missed {n} deadlines in a row")

    async def close(self, drain: bool) -> None:
        """The run is over: let catch-up sends in flight finish (``drain``: a replica behind still needs
        them to finish its step; each send is bounded by the transport's timeout), else stop them."""
        if not drain:
            for task in list(self._sends):
                task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)

    def _apply(self, mean: torch.Tensor) -> None:
        # One code path for contributors and catch-up: identical inputs give identical gradients.
        self.runner.set_grad_vector(mean * len(self.peers))

    def _note_members(self, members: tuple[int, ...]) -> None:
        self.missed_by = [0 if i in members else n + 1 for i, n in enumerate(self.missed_by)]

    def _start_send(self, peer: str, tag: Tag, payload: bytes) -> None:
        # In the background: a replica that is behind (its mailbox filling) must not hold the step up.
        async def send() -> None:
            try:
                await self.box.send(peer, tag, payload)
            except WireError as e:
                logger.info("catch-up for %s not delivered: %s", peer, e)

        task = asyncio.create_task(send(), name=f"catch-up-{peer[-8:]}")
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
