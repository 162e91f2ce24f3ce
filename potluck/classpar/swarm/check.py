"""The coordinator's check of the sub-networks peers say they hold, before a class-parallel plan serves
them (a peer can lie: its ``ClassParSubnet`` record carries its own accuracy figure).

For every unit hash a holder's record names, the coordinator fetches the model by that hash from the
holder, loads it (``weights_only``: it cannot run code) and measures its (|g|+1)-way accuracy on the
job's seeded validation images; the teacher, fetched once by the plan's hash, is measured the same way
(its softmax folded to the group). A unit passes when it is at most ``tolerance`` below the teacher.
A holder whose records name a hash other than the unit's builder's, or a unit that fails, is refused:
its records are not counted, so the plan does not serve it, and the service re-deals its workers.
A fetch that fails is retried next round (no verdict).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from potluck.classpar import recipe
from potluck.classpar.errors import ClassParallelError
from potluck.classpar.model import SmallCNN
from potluck.classpar.swarm.plan import builder_hashes
from potluck.classpar.swarm.streams import fetch_blob
from potluck.net.dial import AddressBook
from potluck.net.streams import Streams
from potluck.protocol.classpar import ClassParPlan, ClassParSubnet
from potluck.protocol.errors import WireError
from potluck.protocol.jobspec import JobSpec

logger = logging.getLogger(__name__)

ACCURACY_TOLERANCE = 0.15  # how far below the teacher (folded to its group) a sub-network may score
FETCH_TIMEOUT_S = 10.0


class SubnetChecker:
    def __init__(
        self,
        streams: Streams,
        swarm_id: str,
        job: JobSpec,
        addresses: AddressBook | None = None,
        tolerance: float = ACCURACY_TOLERANCE,
    ) -> None:
        assert job.class_parallel is not None
        self.streams, self.swarm_id, self.job, self.addresses = streams, swarm_id, job, addresses
        self.spec, self.tolerance = job.class_parallel, tolerance
        self.verdicts: dict[str, bool] = {}  # unit hash -> passed
        self.refused: set[str] = set()  # holders refused (their sub-networks failed, or hashes differ)
        self._teacher: tuple[str, SmallCNN] | None = None

    async def accepted(self, plan: ClassParPlan, subnets: Sequence[ClassParSubnet]) -> list[ClassParSubnet]:
        """The records of ``plan``'s holders whose every unit passed; checks the new hashes first."""
        canonical = builder_hashes(plan, subnets)
        out = []
        for rec in subnets:
            if rec.peer_id not in plan.holders or not rec.matches(plan) or rec.peer_id in self.refused:
                continue
            hashes = rec.unit_hashes()
            differ = [u for u, sha in hashes.items() if canonical.get(u, sha) != sha]
            if differ:
                self._refuse(rec.peer_id, f"its units {differ} are not their builders'")
                continue
            verdicts = [await self._verdict(plan, rec.peer_id, u, sha) for u, sha in sorted(hashes.items())]
            if all(v is True for v in verdicts):
                out.append(rec)
            elif any(v is False for v in verdicts):
                self._refuse(rec.peer_id, "a sub-network it holds failed the accuracy check")
        return out

    def _refuse(self, peer: str, why: str) -> None:
        if peer not in self.refused:
            self.refused.add(peer)
            logger.warning("class-parallel holder %s refused: %s", peer, why)

    async def _verdict(self, plan: ClassParPlan, peer: str, unit: int, sha: str) -> bool | None:
        if sha in self.verdicts:
            return self.verdicts[sha]
        teacher = await self._get_teacher(plan)
        if teacher is None:
            return None
        try:
            blob = await self._fetch(peer, plan.job, sha)
            loaded = recipe.load_unit(blob, sha, plan.groups[unit])
        except WireError as e:
            logger.info("unit %d not fetched from %s for its check: %s", unit, peer[:12], e)
            return None
        except ClassParallelError as e:
            logger.warning("unit %d from %s is not a sub-network of its group: %s", unit, peer[:12], e)
            self.verdicts[sha] = False
            return False
        group, seed = plan.groups[unit], self.job.seed
        folder = self.job.data.path if self.job.data.source == "directory" else None  # the owner's copy
        acc = await asyncio.to_thread(
            recipe.group_accuracy, loaded.subnet.model, group, self.spec, seed, folder
        )
        ref = await asyncio.to_thread(recipe.group_accuracy, teacher, group, self.spec, seed, folder)
        self.verdicts[sha] = ok = acc >= ref - self.tolerance
        log = logger.info if ok else logger.warning
        log(
            "unit %d (%s) from %s: accuracy %.3f, teacher %.3f: %s",
            unit,
            sha[:12],
            peer[:12],
            acc,
            ref,
            "passed" if ok else "failed",
        )
        return ok

    async def _get_teacher(self, plan: ClassParPlan) -> SmallCNN | None:
        sha = plan.teacher_sha256
        if sha is None:
            return None
        if self._teacher is not None and self._teacher[0] == sha:
            return self._teacher[1]
        for peer in dict.fromkeys([plan.teacher, *plan.workers]):
            try:
                net, _ = recipe.from_bytes(await self._fetch(peer, plan.job, sha))
            except (WireError, ClassParallelError) as e:
                logger.info("teacher not fetched from %s: %s", peer[:12], e)
                continue
            self._teacher = (sha, net)
            return net
        return None

    async def _fetch(self, peer: str, job: str, sha: str) -> bytes:
        return await fetch_blob(
            self.streams,
            peer,
            self.swarm_id,
            job,
            sha,
            FETCH_TIMEOUT_S,
            recipe.MAX_BLOB_BYTES,
            self.addresses,
        )
