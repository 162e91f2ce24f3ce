"""DHT keys and MQTT topics of a swarm, their lifetimes, and the protocol version.

Every DHT key is ``potluck/<swarm>/<name>``; record kinds are fixed per name so a validator knows which
schema and which signer a key requires. A swarm's first job (its coordinator's) keeps the swarm-level
``job``, ``plan`` and ``progress`` names (a class-parallel job also ``classpar``, ``classpar-teacher``
and ``classpar-subnets``); each job added to the swarm (``potluck launch --join``) has its own under
``<job>/job``, ``<job>/plan``, ``<job>/progress`` (``JobKeys``), signed by the swarm's coordinator or
by the job's owner, whose admission names the job (``admission.owner_role``).
Lifetimes are upper bounds a validator enforces: a record whose expiration lies further ahead is
refused, so a leaked or replayed record cannot outlive its purpose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from potluck.protocol.errors import RecordError

PROTOCOL_VERSION = 1

# Swarm ids appear in keys, topics and file names: keep them short and boring.
SWARM_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class KeySpec:
    """What may be stored under one DHT key name."""

    name: str
    kind: str  # record kind expected in the envelope
    # "subkey": signed by the peer named by the subkey; "coordinator": by the swarm's coordinator;
    # "job": by the swarm's coordinator or by the owner of the job the key name starts with
    signer: str
    max_ttl_s: float  # furthest allowed expiration, seconds after now


PEERS = KeySpec("peers", "PeerRecord", signer="subkey", max_ttl_s=300.0)
LINKS = KeySpec("links", "LinkReport", signer="subkey", max_ttl_s=3600.0)
JOB = KeySpec("job", "JobSpec", signer="coordinator", max_ttl_s=3600.0)
PLAN = KeySpec("plan", "TrainPlan", signer="coordinator", max_ttl_s=3600.0)
PROGRESS = KeySpec("progress", "Progress", signer="subkey", max_ttl_s=600.0)
BANS = KeySpec("bans", "BanList", signer="coordinator", max_ttl_s=3600.0)
TOKENS = KeySpec("tokens", "TokenUses", signer="coordinator", max_ttl_s=3600.0)
# Several jobs on one swarm (docs/multijob.md): the leases of the round, and the jobs offered to it
ALLOCATION = KeySpec("allocation", "Allocation", signer="coordinator", max_ttl_s=3600.0)
JOBS = KeySpec("jobs", "JobOffer", signer="subkey", max_ttl_s=600.0)
# Class-parallel jobs (docs/class-parallel.md): the plan, the teacher, the sub-networks peers hold
CLASSPAR = KeySpec("classpar", "ClassParPlan", signer="coordinator", max_ttl_s=3600.0)
CLASSPAR_TEACHER = KeySpec("classpar-teacher", "ClassParTeacher", signer="subkey", max_ttl_s=3600.0)
CLASSPAR_SUBNETS = KeySpec("classpar-subnets", "ClassParSubnet", signer="subkey", max_ttl_s=600.0)

KEY_SPECS: dict[str, KeySpec] = {
    spec.name: spec
    for spec in (
        PEERS,
        LINKS,
        JOB,
        PLAN,
        PROGRESS,
        BANS,
        TOKENS,
        ALLOCATION,
        JOBS,
        CLASSPAR,
        CLASSPAR_TEACHER,
        CLASSPAR_SUBNETS,
    )
}
# The names each added job has of its own, as "<job>/<name>"
JOB_SCOPED: dict[str, KeySpec] = {
    "job": KeySpec("job", "JobSpec", signer="job", max_ttl_s=3600.0),
    "plan": KeySpec("plan", "TrainPlan", signer="job", max_ttl_s=3600.0),
    "progress": PROGRESS,
    "classpar": KeySpec("classpar", "ClassParPlan", signer="job", max_ttl_s=3600.0),
    "classpar-teacher": CLASSPAR_TEACHER,
    "classpar-subnets": CLASSPAR_SUBNETS,
}
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # records.Name


@dataclass(frozen=True)
class JobKeys:
    """The key names of one job's records: the swarm-level ones for the swarm's first job (``home``)."""

    job_name: str
    home: bool = True

    def _name(self, base: str) -> str:
        return base if self.home else scoped(self.job_name, base)

    @property
    def job(self) -> str:
        return self._name(JOB.name)

    @property
    def plan(self) -> str:
        return self._name(PLAN.name)

    @property
    def progress(self) -> str:
        return self._name(PROGRESS.name)

    @property
    def classpar(self) -> str:
        return self._name(CLASSPAR.name)

    @property
    def classpar_teacher(self) -> str:
        return self._name(CLASSPAR_TEACHER.name)

    @property
    def classpar_subnets(self) -> str:
        return self._name(CLASSPAR_SUBNETS.name)


def scoped(job: str, base: str) -> str:
    """The key name of ``job``'s own ``base`` records (``base`` in ``JOB_SCOPED``)."""
    if not JOB_NAME_RE.match(job) or base not in JOB_SCOPED:
        raise RecordError(f"no job-scoped key {job!r}/{base!r}")
    return f"{job}/{base}"


def split_name(name: str) -> tuple[str | None, KeySpec]:
    """(the job a job-scoped name belongs to, or None; the name's spec); ``RecordError`` if unknown."""
    job, sep, base = name.partition("/")
    if not sep:
        spec = KEY_SPECS.get(name)
        if spec is None:
            raise RecordError(f"unknown record name {name!r}; known: {sorted(KEY_SPECS)}")
        return None, spec
    if not JOB_NAME_RE.match(job) or base not in JOB_SCOPED:
        raise RecordError(f"unknown record name {name!r}")
    return job, JOB_SCOPED[base]


def check_swarm_id(swarm_id: str) -> str:
    if not SWARM_ID_RE.match(swarm_id):
        raise RecordError(
            f"invalid swarm id {swarm_id!r}: use 1-63 characters of a-z, 0-9 and '-', starting alphanumeric"
        )
    return swarm_id


def dht_key(swarm_id: str, name: str) -> str:
    """The DHT key under which records named ``name`` of swarm ``swarm_id`` live."""
    check_swarm_id(swarm_id)
    split_name(name)
    return f"potluck/{swarm_id}/{name}"


def mqtt_topic(swarm_id: str, *parts: str) -> str:
    """An MQTT topic under the swarm, e.g. ``potluck/<swarm>/peer/<id>/status``."""
    check_swarm_id(swarm_id)
    return "/".join(("potluck", swarm_id, *parts))
