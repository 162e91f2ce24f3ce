"""A peer's part in a class-parallel job (docs/class-parallel.md): train, build, hold and serve.

The peer daemon runs this worker on a class-parallel swarm (``peer/kinds.py``); it idles until the
swarm's ``ClassParPlan`` appears, then follows its newest epoch:

- ``teacher`` names this peer: it trains the teacher from the job's seed (``classpar.recipe``), keeps
  its serialization to serve, and publishes a ``ClassParTeacher`` record (hash, mean class features).
- ``building``/``serving``: for each coded worker the plan gives this peer, it loads the units of the
  worker's support: its own group (w < G) it builds from the teacher (fetched by hash from the teacher's
  peer, or from any holder that has it); a parity's units (w >= G) it fetches by hash from their
  builders, as their ``ClassParSubnet`` records name them. Then it publishes its own ``ClassParSubnet``.
- It answers ``scores`` and ``blob`` requests of admitted peers on ``potluck/<swarm>/classpar/1``
  (``classpar/swarm/streams.py``) for as long as it runs.

Training and inference run in worker threads; every network wait is bounded.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import torch
from hivemind.utils import get_dht_time

from potluck.classpar import recipe
from potluck.classpar.errors import ClassParallelError
from potluck.classpar.model import SmallCNN
from potluck.classpar.swarm.streams import fetch_blob, serve_classpar
from potluck.net.admit import admitted
from potluck.net.dial import dht_addresses
from potluck.net.node import SwarmNode
from potluck.net.streams import Streams
from potluck.peer.data.paths import local_data
from potluck.peer.kinds import Seat
from potluck.protocol.classpar import ClassParPlan, ClassParSubnet, ClassParTeacher, HeldUnit, HeldWorker
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.errors import WireError
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JobKeys

logger = logging.getLogger(__name__)

POLL_S = 1.0  # seconds between two reads of the plan
IDLE_POLL_S = 5.0  # the same while the swarm has no class-parallel plan yet
RECORD_TTL_S = 60.0  # lifetime of the teacher and subnet records; refreshed every third of it
FETCH_TIMEOUT_S = 10.0  # bound on one blob fetch
SERVE_TIMEOUT_S = 10.0  # bound on each frame of a served request


class ClassParWorker:
    def __init__(
        self,
        node: SwarmNode,
        swarm_id: str,
        policy: TrustPolicy,
        keys: JobKeys | None = None,
        data: tuple[Path, Path | None] | None = None,
    ) -> None:
        """``data``: (state directory, --data-dir or None): where this machine keeps a job's image folder
        (``peer.data.paths.local_data``); None: procedural jobs only."""
        self.node, self.swarm_id, self.policy, self.data = node, swarm_id, policy, data
        self.peer_id = node.identity.peer_id
        self.keys = keys or JobKeys("", home=True)
        self.streams = Streams(node.p2p)
        self.streams.credentials = lambda: node.admission
        self._addresses = dht_addresses(node)
        self.job: JobSpec | None = None
        self.plan: ClassParPlan | None = None
        self.blobs: dict[str, bytes] = {}  # sha256 -> a model this peer serves (teacher, units)
        self.teacher: tuple[str, SmallCNN] | None = None  # (sha256, model)
        self.units: dict[int, recipe.Unit] = {}  # unit -> loaded sub-network (for the plan's grouping)
        self.held: set[int] = set()  # coded workers whose support is loaded
        self._built_for: tuple[str | None, list[list[int]]] | None = None
        self._teacher_record: ClassParTeacher | None = None
        self._published_at = -1e9
        self._serving = False

    async def run(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception:  # one bad round must not end the peer; the next one tries again
                logger.exception("class-parallel round failed")
            await asyncio.sleep(POLL_S if self.job is not None else IDLE_POLL_S)

    async def _tick(self) -> None:
        if self.job is None:
            jobs = [v.record for v in await self.node.fetch(self.keys.job) if isinstance(v.record, JobSpec)]
            self.job = next((j for j in jobs if j.kind == "class_parallel"), None)
            if self.job is None:
                return
        plans = [
            v.record for v in await self.node.fetch(self.keys.classpar) if isinstance(v.record, ClassParPlan)
        ]
        plan = max(plans, key=lambda p: (p.epoch, p.status == "serving"), default=None)
        if plan is None or plan.job != self.job.name:
            return
        if self.plan is not None and plan.epoch < self.plan.epoch:
            return
        if not self._serving:
            await serve_classpar(
                self.streams, self.swarm_id, self._scores, self._blob, self._allow, SERVE_TIMEOUT_S
            )
            self._serving = True
        if self.plan is None or plan.epoch != self.plan.epoch:
            logger.info(
                "class-parallel plan epoch %d (%s): workers %s here",
                plan.epoch,
                plan.status,
                plan.workers_of(self.peer_id),
            )
        self.plan = plan
        if plan.teacher == self.peer_id and self._teacher_record is None:
            await self._train_teacher(plan)
        if plan.status != "teacher":
            await self._hold(plan)
        await self._publish(plan)

    def _allow(self, peer: str, admission: bytes | None) -> bool:
        return admitted(self.policy, peer, admission, get_dht_time())

    async def _blob(self, job: str, sha: str) -> bytes | None:
        return self.blobs.get(sha) if self.job is not None and job == self.job.name else None

    async def _scores(self, job: str, worker: int, x: np.ndarray) -> np.ndarray:
        plan = self.plan
        if plan is None or self.job is None or job != self.job.name or worker not in self.held:
            raise LookupError(f"worker {worker} of job {job!r} is not served here")
        code = recipe.make_code(plan.code, len(plan.groups), plan.parity)
        units = dict(self.units)
        return await asyncio.to_thread(recipe.worker_reply, code, worker, units, torch.from_numpy(x))

    def _folder(self) -> str | None:
        """This machine's copy of the job's image folder (None: the job's images are procedural)."""
        if self.job is None or self.job.data.source != "directory" or self.data is None:
            return None
        return local_data(self.job.data, self.data[0], self.data[1], None).path

    async def _train_teacher(self, plan: ClassParPlan) -> None:
        assert self.job is not None and self.job.class_parallel is not None
        spec, seed = self.job.class_parallel, self.job.seed
        teacher, feats, acc = await asyncio.to_thread(recipe.train_teacher, spec, seed, self._folder())
        blob = recipe.to_bytes(teacher, list(range(feats.shape[0])))
        sha = recipe.sha256(blob)
        self.blobs[sha], self.teacher = blob, (sha, teacher)
        self._teacher_record = ClassParTeacher(
            peer_id=self.peer_id,
            job=plan.job,
            epoch=plan.epoch,
            sha256=sha,
            size_bytes=len(blob),
            features=[[float(v) for v in row] for row in feats],
            val_accuracy=acc,
            issued_at=get_dht_time(),
        )
        self._published_at = -1e9  # publish at once

    async def _get_teacher(self, plan: ClassParPlan) -> SmallCNN | None:
        assert plan.teacher_sha256 is not None
        if self.teacher is not None and self.teacher[0] == plan.teacher_sha256:
            return self.teacher[1]
        holders = [plan.teacher] + [p for p in plan.workers if p not in (plan.teacher, self.peer_id)]
        for peer in dict.fromkeys(holders):
            try:
                blob = await fetch_blob(
                    self.streams,
                    peer,
                    self.swarm_id,
                    plan.job,
                    plan.teacher_sha256,
                    FETCH_TIMEOUT_S,
                    recipe.MAX_BLOB_BYTES,
                    self._addresses,
                )
                net, _ = recipe.from_bytes(blob)
            except (WireError, ClassParallelError) as e:
                logger.info("teacher not fetched from %s: %s", peer[:12], e)
                continue
            self.blobs[plan.teacher_sha256], self.teacher = blob, (plan.teacher_sha256, net)
            return net
        return None

    async def _hold(self, plan: ClassParPlan) -> None:
        """Load the support of every worker the plan gives this peer (what is loaded already stays)."""
        assert self.job is not None and self.job.class_parallel is not None
        if self._built_for != (plan.teacher_sha256, plan.groups):  # a new teacher or grouping: start over
            self.units, self.held = {}, set()
            self._built_for = (plan.teacher_sha256, [list(g) for g in plan.groups])
        code = recipe.make_code(plan.code, len(plan.groups), plan.parity)
        for worker in plan.workers_of(self.peer_id):
            if worker in self.held:
                continue
            for unit in code.support(worker):
                if unit not in self.units:
                    await self._load_unit(plan, unit, build=worker == unit)
            if all(u in self.units for u in code.support(worker)):
                self.held.add(worker)
                self._published_at = -1e9
                logger.info("holding coded worker %d (units %s)", worker, code.support(worker))

    async def _load_unit(self, plan: ClassParPlan, unit: int, build: bool) -> None:
        """Fetch ``unit`` from a peer that holds it; when none does and ``build`` (this peer is its
        builder), build it from the teacher. A builder dealt a lost group fetches the copy the parity
        holders keep rather than building another (which would not match their parities bit for bit)."""
        assert self.job is not None and self.job.class_parallel is not None
        if await self._fetch_unit(plan, unit) or not build:
            return
        teacher = await self._get_teacher(plan)
        if teacher is None:
            return
        spec, seed, groups = self.job.class_parallel, self.job.seed, plan.groups
        folder = self._folder()
        built = await asyncio.to_thread(recipe.build_unit, teacher, spec, seed, groups, unit, folder)
        self._keep(unit, built)

    async def _fetch_unit(self, plan: ClassParPlan, unit: int) -> bool:
        """True when ``unit`` was fetched (False also when no peer offers it)."""
        # Its builder first; then any peer the plan names that holds it (a parity holder fetched it too),
        # each with the hash its own signed record names: the fetched bytes must match it.
        builder = plan.workers[unit]
        found = [v.record for v in await self.node.fetch(self.keys.classpar_subnets)]
        sources = [
            (rec.peer_id, rec.unit_hashes()[unit])
            for rec in found
            if isinstance(rec, ClassParSubnet)
            and rec.peer_id in plan.holders
            and rec.peer_id != self.peer_id
            and rec.matches(plan)
            and unit in rec.unit_hashes()
        ]
        for peer, sha in sorted(sources, key=lambda s: s[0] != builder):
            try:
                blob = await fetch_blob(
                    self.streams,
                    peer,
                    self.swarm_id,
                    plan.job,
                    sha,
                    FETCH_TIMEOUT_S,
                    recipe.MAX_BLOB_BYTES,
                    self._addresses,
                )
                self._keep(unit, recipe.load_unit(blob, sha, plan.groups[unit]))
                return True
            except (WireError, ClassParallelError) as e:
                logger.info("unit %d not fetched from %s: %s", unit, peer[:12], e)
        return False

    def _keep(self, unit: int, loaded: recipe.Unit) -> None:
        self.units[unit] = loaded
        self.blobs[loaded.sha256] = loaded.blob

    def _held_record(self, plan: ClassParPlan) -> ClassParSubnet | None:
        if not self.held or plan.teacher_sha256 is None:
            return None
        code = recipe.make_code(plan.code, len(plan.groups), plan.parity)
        held = [
            HeldWorker(worker=w, units=[self._held_unit(u) for u in code.support(w)])
            for w in sorted(self.held)
        ]
        return ClassParSubnet(
            peer_id=self.peer_id,
            job=plan.job,
            teacher_sha256=plan.teacher_sha256,
            groups=plan.groups,
            held=held,
            issued_at=get_dht_time(),
        )

    def _held_unit(self, unit: int) -> HeldUnit:
        u = self.units[unit]
        return HeldUnit(unit=unit, sha256=u.sha256, macs=u.subnet.macs, val_accuracy=u.val_accuracy)

    async def _publish(self, plan: ClassParPlan) -> None:
        """The teacher and subnet records: at once when they changed, else every third of their TTL."""
        now = get_dht_time()
        if now - self._published_at < RECORD_TTL_S / 3:
            return
        self._published_at = now
        if self._teacher_record is not None:
            rec = self._teacher_record.model_copy(update={"issued_at": now})
            await self.node.publish(self.keys.classpar_teacher, rec, RECORD_TTL_S, self.peer_id)
        held = self._held_record(plan)
        if held is not None:
            await self.node.publish(self.keys.classpar_subnets, held, RECORD_TTL_S, self.peer_id)


def classpar_worker(seat: Seat) -> ClassParWorker:
    """The class-parallel job kind's worker for the peer daemon (``peer/kinds.py``)."""
    return ClassParWorker(seat.node, seat.swarm_id, seat.policy, None, seat.data)
