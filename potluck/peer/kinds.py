"""The job-kind seam of the peer: what a swarm's kind of job runs on a volunteer's machine.

A swarm trains one kind of job (``JobSpec.kind``): "pipeline", the LLM path (``peer/worker.py``),
is built in; any other kind is handed to the daemon by whoever starts it, as a
factory of ``KindWorker`` (the CLI hands it ``classpar.swarm``'s for "class_parallel"). The daemon reads
the swarm's job once it is admitted (``swarm_kind``, while its heartbeat already runs) and then runs that
kind's worker alone, so a peer never keeps an idle worker of a kind its swarm does not run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from potluck.net.node import SwarmNode
from potluck.peer.config import WorkerConfig
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JobKeys

logger = logging.getLogger(__name__)

PIPELINE = "pipeline"  # the built-in kind: a transformer over stages and replicas (the LLM path)
KIND_POLL_S = 1.0  # seconds between two reads of the swarm's job while it is not found yet
WAITING_SAID_AFTER_S = 10.0  # a peer that cannot read the swarm's job says so after this long


@dataclass(frozen=True)
class Seat:
    """What the daemon gives the worker of a job kind: its place in the swarm and its machine."""

    node: SwarmNode
    swarm_id: str
    identity: Identity
    policy: TrustPolicy  # the swarm's trust policy, with the ban list the daemon keeps current
    owner: str  # the swarm coordinator's peer id
    cotenant: bool  # this peer is a shared device's second peer: it serves only what a lease names
    worker: WorkerConfig  # device, precision, state and data directories

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def data(self) -> tuple[Path, Path | None]:
        """(state directory, --data-dir or None): where this machine keeps a job's files."""
        return self.worker.state_dir, self.worker.data_dir


class KindWorker(Protocol):
    """A job kind's side of the peer: runs until cancelled."""

    async def run(self) -> None: ...


KindFactory = Callable[[Seat], KindWorker]
JobKinds = Mapping[str, KindFactory]


async def swarm_kind(node: SwarmNode) -> str:
    """The kind of the swarm's own job, read from its signed spec; asked again every ``KIND_POLL_S``
    until it is readable (a coordinator that is restarting republishes it). Cancelled with the task."""
    key = JobKeys("", home=True).job
    loop = asyncio.get_running_loop()
    started, said = loop.time(), False
    while True:
        try:
            found = [v.record for v in await node.fetch(key) if isinstance(v.record, JobSpec)]
        except Exception as e:  # unreadable now: the next read may succeed
            logger.info("reading the swarm's job failed: %s", e)
            found = []
        if found:
            return found[0].kind
        if not said and loop.time() - started > WAITING_SAID_AFTER_S:
            logger.info("the swarm's job spec is not readable yet; still asking")
            said = True
        await asyncio.sleep(KIND_POLL_S)
