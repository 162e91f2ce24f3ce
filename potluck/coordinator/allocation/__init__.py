"""Multi-job allocation, pure (Gavel, OSDI 2020): which peers serve which job, round by round.

``allocate(now, jobs, peers, throughput, policy, prev) -> (Allocation, reason)`` is the entry point
(``rounds.py``); peer classes in ``classes.py``, effective throughput in ``throughput.py``, the policies
as linear programs in ``policies.py`` over ``problem.py``'s arrays. The simulator that replays Gavel's
traces through them is ``potluck.sim.cluster``. See docs/multijob.md.
"""

from potluck.coordinator.allocation.classes import (
    ClassProfile,
    PeerInfo,
    classify,
    group,
    is_cotenant,
    shared_devices,
)
from potluck.coordinator.allocation.errors import AllocationError, SolverError
from potluck.coordinator.allocation.policies import POLICIES, PolicyResult, evaluate, solve
from potluck.coordinator.allocation.problem import Problem, agnostic, equal_share, make_problem
from potluck.coordinator.allocation.rounds import AllocConfig, JobDemand, allocate
from potluck.coordinator.allocation.throughput import (
    ChurnStats,
    PairKey,
    RateEstimate,
    Throughput,
    churn_discount,
    estimate,
    observe,
    pair_prior,
    prior_rate,
    watch_churn,
)

__all__ = [
    "POLICIES",
    "AllocConfig",
    "AllocationError",
    "ChurnStats",
    "ClassProfile",
    "JobDemand",
    "PairKey",
    "PeerInfo",
    "PolicyResult",
    "Problem",
    "RateEstimate",
    "SolverError",
    "Throughput",
    "agnostic",
    "allocate",
    "churn_discount",
    "classify",
    "equal_share",
    "estimate",
    "evaluate",
    "group",
    "is_cotenant",
    "make_problem",
    "observe",
    "pair_prior",
    "prior_rate",
    "shared_devices",
    "solve",
    "watch_churn",
]
