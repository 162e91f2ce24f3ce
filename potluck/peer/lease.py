"""Which job this peer serves on a swarm of several jobs (docs/multijob.md). Pure.

Without an ``Allocation`` in force a peer serves the swarm's own job, as in a one-job swarm. With one,
it serves the job its lease names, or none (idle) when it holds no lease this round. A peer moves to
another job the way it leaves a swarm (``leave.leave_verdict``): it keeps following the job it serves
until that job's next plan, made without it, is under way, so the job it leaves loses no committed
step; only then does it follow the new job's keys.
"""

from __future__ import annotations

from potluck.protocol.allocation import Allocation
from potluck.protocol.keys import JobKeys

HOME = JobKeys("", home=True)  # the swarm's own job: its swarm-level keys


def keys_of(job: str, home_job: str | None) -> JobKeys:
    """The keys of ``job``'s records: the swarm-level ones for the swarm's own job (``home_job``)."""
    return HOME if home_job is None or job == home_job else JobKeys(job, home=False)


def leased_job(
    allocation: Allocation | None, peer_id: str, home_job: str | None, cotenant: bool = False
) -> JobKeys | None:
    """The keys of the job ``peer_id`` is to serve under ``allocation`` (None: no lease, idle). A
    co-tenant (the second peer of a shared device, ``potluck peer --share-device``) serves only what a
    lease names it for: without an allocation it idles, leaving the device to its own peer."""
    if allocation is None:
        return None if cotenant else HOME
    jobs = allocation.assignment().get(peer_id)
    if not jobs:
        return None
    return keys_of(jobs[0], home_job)  # a shared worker with no co-tenant (a simulation): its first job


def describe(keys: JobKeys | None) -> str:
    if keys is None:
        return "no job (no lease this round)"
    return "the swarm's own job" if keys.home else f"job {keys.job_name}"
