"""The placement optimizer, a pure library: which peer runs which stage of which pipeline.

``plan(state, job, now, previous, cfg) -> (PlacementPlan | None, reason)`` is the entry point. With no
previous plan it searches from scratch (``fresh``); with one it repairs it locally and migrates only
when that pays (``repair``); when repair cannot keep a pipeline it plans afresh, and the reason says so.
The vocabulary both share is in ``types``. Guide: docs/planner.md.
"""

from __future__ import annotations

import logging

from potluck.coordinator.placement.fresh import fresh_plan
from potluck.coordinator.placement.repair import repair
from potluck.coordinator.placement.types import (
    Job,
    PeerId,
    PlacementPlan,
    PlannerConfig,
    PlanningState,
)

logger = logging.getLogger(__name__)

__all__ = ["Job", "PeerId", "PlacementPlan", "PlannerConfig", "PlanningState", "plan"]


def plan(
    state: PlanningState,
    job: Job,
    now: float,
    previous: PlacementPlan | None = None,
    cfg: PlannerConfig | None = None,
) -> tuple[PlacementPlan | None, str]:
    """Plan from scratch, or repair `previous` after peers left or joined or links changed.

    A repair that cannot keep a pipeline falls back to a fresh search. `now` (seconds, caller's clock)
    is recorded in the plan's detail; the plan does not depend on it.
    """
    cfg = cfg or PlannerConfig()
    if previous is None:
        result, reason = fresh_plan(state, job, cfg)
    else:
        result, reason = repair(state, job, previous, cfg)
        if result is None:
            result, fresh_reason = fresh_plan(state, job, cfg)
            reason = f"{reason}; {fresh_reason}"
    if result is not None:
        result.detail["planned_at"] = now
    logger.info("plan: %s", reason)
    return result, reason
