"""The swarm's allocation of peers to jobs for one round of leases (several jobs on one swarm).

The coordinator that allocates (``potluck.coordinator.allocation``) signs one ``Allocation`` per round:
which peers serve which job until ``lease_end``, and for every job (or pair of jobs sharing workers) the
policy's time fraction per peer class and the lease time it has received so far. Peers serve whichever
job their lease names; dashboards show the shares; a restarted coordinator carries on from the newest
record (the received times are the mechanism's whole memory).

Like every record it is frozen, bounded and refuses unknown fields; ``MAX_ALLOCATION_BYTES`` keeps it
inside one DHT value with the envelope around it (``envelope.DEFAULT_MAX_VALUE_BYTES`` = 64 KiB).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator
from pydantic import SerializerFunctionWrapHandler as Handler

from potluck.protocol.records import Name, NonNegFloat, PeerId, Record

# Peer classes are named by the allocator ("cuda:nvidia-geforce-rtx-3090/f5/m4/u2", or "v100" in a
# simulation); the characters are those of such names.
ClassId = Annotated[str, Field(min_length=1, max_length=96, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/+=-]*$")]
Seconds = Annotated[float, Field(ge=0.0, le=1e10, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0 + 1e-6, allow_inf_nan=False)]
PolicyLabel = Literal["max_min", "las", "makespan", "max_throughput", "fifo"]
MAX_ALLOCATION_BYTES = 60 * 1024  # canonical JSON; leaves 4 KiB of the 64 KiB value to the envelope


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ClassWorkers(_Part):
    """A peer class and the peers it counted when the allocation was solved."""

    peer_class: ClassId
    workers: int = Field(ge=0, le=100_000)
    shareable: bool = False  # its peers let two jobs share one device (space sharing)


class ClassShare(_Part):
    """One row's standing on one class."""

    peer_class: ClassId
    allocation: Fraction  # X: the time fraction the policy gives the row on this class
    received_s: Seconds  # lease time the row has held on this class, seconds


class RowShare(_Part):
    """One job, or two jobs sharing the same workers, with its shares per class."""

    jobs: list[Name] = Field(min_length=1, max_length=2)
    present_s: Seconds  # lease time that has passed while the row existed, seconds
    shares: list[ClassShare] = Field(default_factory=list, max_length=256)

    def received_fraction(self, peer_class: str) -> float:
        """Share of its time the row has held ``peer_class`` (0 before any time has passed)."""
        got = sum(s.received_s for s in self.shares if s.peer_class == peer_class)
        return got / self.present_s if self.present_s > 0 else 0.0


class Lease(_Part):
    """Peers of one class serving a row until the round's ``lease_end``.

    A space-shared row (two jobs) on devices that run two peers (``PeerRecord.cotenant``): ``peers`` serve
    ``jobs[0]`` and ``partners[i]``, the co-tenant on ``peers[i]``'s device, serves ``jobs[1]``. Without
    partners (a simulation's workers) every peer serves both jobs."""

    jobs: list[Name] = Field(min_length=1, max_length=2)
    peer_class: ClassId
    peers: list[PeerId] = Field(min_length=1, max_length=4096)
    partners: list[PeerId] = Field(default_factory=list, max_length=4096)

    @model_serializer(mode="wrap")
    def _omit_no_partners(self, handler: Handler) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        if out.get("partners") == []:
            del out["partners"]  # a one-job lease reads byte for byte as before the field
        return out

    @model_validator(mode="after")
    def _partners_fit(self) -> Lease:
        if self.partners and (len(self.jobs) != 2 or len(self.partners) != len(self.peers)):
            raise ValueError("partners come one per peer, and only on a lease of two jobs")
        if set(self.partners) & set(self.peers) or len(set(self.partners)) != len(self.partners):
            raise ValueError("a lease names a peer twice among its peers and partners")
        return self

    def serving(self) -> dict[str, tuple[str, ...]]:
        """peer id -> the job(s) it serves under this lease."""
        if not self.partners:
            return {p: tuple(self.jobs) for p in self.peers}
        out: dict[str, tuple[str, ...]] = {p: (self.jobs[0],) for p in self.peers}
        return out | {p: (self.jobs[1],) for p in self.partners}


class Allocation(Record):
    """Signed by the swarm's coordinator (its allocator), one value under the ``allocation`` key."""

    KIND: ClassVar[str] = "Allocation"

    round: int = Field(ge=0, lt=2**40)
    policy: PolicyLabel
    aware: bool = True  # False: the heterogeneity-blind baseline
    lease_start: Seconds  # DHT time (unix seconds) this round began
    lease_end: Seconds  # ... and ends; peers change jobs only here
    solved_at: Seconds  # when the allocation X was last solved
    classes: list[ClassWorkers] = Field(default_factory=list, max_length=256)
    rows: list[RowShare] = Field(default_factory=list, max_length=1024)
    leases: list[Lease] = Field(default_factory=list, max_length=4096)
    issued_at: NonNegFloat

    @model_validator(mode="after")
    def _consistent(self) -> Allocation:
        if self.lease_end <= self.lease_start:
            raise ValueError("lease_end must come after lease_start")
        known = {c.peer_class for c in self.classes}
        if len(known) != len(self.classes):
            raise ValueError("a peer class is listed twice")
        singles = {r.jobs[0] for r in self.rows if len(r.jobs) == 1}
        if len(singles) != sum(len(r.jobs) == 1 for r in self.rows):
            raise ValueError("a job has two rows of its own")
        for r in self.rows:
            if len(set(r.jobs)) != len(r.jobs) or not set(r.jobs) <= singles:
                raise ValueError(f"row {r.jobs} names a job twice or a job without its own row")
            if any(s.peer_class not in known for s in r.shares):
                raise ValueError(f"row {r.jobs} has a share of an unknown class")
        for job in singles:
            total = sum(s.allocation for r in self.rows if job in r.jobs for s in r.shares)
            if total > 1.0 + 1e-6:
                raise ValueError(f"job {job} is allocated {total:.6f} > 1 of its time")
        seen_peers: set[str] = set()
        seen_jobs: set[str] = set()
        for lease in self.leases:
            if lease.peer_class not in known or not set(lease.jobs) <= singles:
                raise ValueError(f"lease {lease.jobs} names an unknown class or job")
            serving = set(lease.serving())
            if seen_jobs & set(lease.jobs) or seen_peers & serving:
                raise ValueError("a job or a peer holds two leases in one round")
            if len(set(lease.peers)) != len(lease.peers):
                raise ValueError("a lease repeats a peer")
            seen_jobs |= set(lease.jobs)
            seen_peers |= serving
        size = len(self.canonical_bytes())
        if size > MAX_ALLOCATION_BYTES:
            raise ValueError(f"allocation is {size} bytes, more than {MAX_ALLOCATION_BYTES}")
        return self

    @property
    def jobs(self) -> list[str]:
        return [r.jobs[0] for r in self.rows if len(r.jobs) == 1]

    def assignment(self) -> dict[str, tuple[str, ...]]:
        """peer id -> the job(s) it serves this round (two when it is space-shared)."""
        return {p: jobs for lease in self.leases for p, jobs in lease.serving().items()}

    def peers_of(self, job: str) -> list[str]:
        return [p for lease in self.leases for p, jobs in lease.serving().items() if job in jobs]

    def allocation_of(self, job: str) -> dict[str, float]:
        """Class -> time fraction the policy gives ``job``, its shared rows included."""
        out: dict[str, float] = {}
        for r in self.rows:
            if job in r.jobs:
                for s in r.shares:
                    out[s.peer_class] = out.get(s.peer_class, 0.0) + s.allocation
        return out

    def received_share(self, job: str) -> dict[str, float]:
        """Class -> share of its time ``job`` has held the class so far, its shared rows included."""
        own = next((r for r in self.rows if r.jobs == [job]), None)
        present = own.present_s if own is not None else 0.0
        out: dict[str, float] = {}
        for r in self.rows:
            if job in r.jobs:
                for s in r.shares:
                    got = s.received_s / present if present > 0 else 0.0
                    out[s.peer_class] = out.get(s.peer_class, 0.0) + got
        return out


# A job offered to a running swarm (``potluck launch --join``): its owner's signed ask for peers. The owner
# trades the invite's token for an admission that names the job (``admission.owner_role``), signs its
# ``JobSpec`` under the job's own key and a ``JobOffer`` under the swarm's ``jobs`` key (subkey: the
# owner's peer id, so one owner key offers one job at a time); docs/multijob.md.
MAX_WEIGHT = 1000.0


class JobOffer(Record):
    """Signed by the job's owner (``peer_id``), under the ``jobs`` key."""

    KIND: ClassVar[str] = "JobOffer"

    peer_id: PeerId  # the owner: the subkey, and the signer
    job: Name
    weight: float = Field(default=1.0, gt=0.0, le=MAX_WEIGHT, allow_inf_nan=False)  # priority weight
    submitted_at: NonNegFloat  # when the owner first offered it (FIFO order), DHT time
    done: bool = False  # the job reached its last step: the owner's final word
    issued_at: NonNegFloat
