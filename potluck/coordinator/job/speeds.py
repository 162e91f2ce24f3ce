"""What the coordinator believes of each peer's speed on its job: TFLOP/s measured while training (from
the plan a peer last ran in, ``plan.calibrated_tflops``), and the peers whose measurement fell far below
their claim (``claims.overclaimed``): their later claims are not believed."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from potluck.coordinator.job.claims import overclaimed
from potluck.coordinator.job.plan import calibrated_tflops
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)


class MeasuredSpeeds:
    def __init__(self) -> None:
        self.measured: dict[str, float] = {}  # peer -> TFLOP/s measured on this job (its latest plan)
        self.distrusted: set[str] = set()  # peers measured far below their claims

    def update(
        self,
        plan: TrainPlan | None,
        job: JobSpec,
        compute_s: Mapping[str, float],
        claims: Mapping[str, float],
    ) -> dict[str, float]:
        """Fold ``plan``'s measured compute times (peer -> seconds of its last step) in, note the peers
        that claim (``claims``: peer -> TFLOP/s) far more than measured, and return every measurement."""
        if plan is not None:
            self.measured.update(calibrated_tflops(plan, job, dict(compute_s)))
        for peer in overclaimed(claims, self.measured):
            if peer not in self.distrusted:
                self.distrusted.add(peer)
                logger.warning(
                    "peer %s claims %.3g TFLOP/s but measured %.3g on this job: its claims are not believed",
                    peer,
                    claims[peer],
                    self.measured[peer],
                )
        return dict(self.measured)
