"""Faults a test or benchmark injects into real peers: the plan, as the peer reads it (docs/testbed.md).

``potluck.testbed.faults`` writes a ``FaultPlan`` into the environment variable ``POTLUCK_FAULTS`` of
the processes it starts (or of this process, for in-process swarms); the peer reads it once, where it
builds each part, and nowhere else:

- ``delay``: the trainer sleeps this long before its replica sync in every step (a straggler), all
  replicas or only those named (``peer/train/trainer.py``);
- ``kill_at_step``: the worker SIGKILLs its own process right after it committed that step (a crash at
  a known step, not at a guessed time; ``peer/worker.py``);
- ``drop``: the training mailbox sends nothing to and accepts nothing from these peers (a link down in
  both directions; ``net/mailbox/``).

Absent, the plan is empty and nothing changes. The variable is parsed like any input: bounded size,
known fields only, bounded values, and a clear error naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from potluck.protocol.errors import FaultError
from potluck.protocol.records import PeerId

ENV = "POTLUCK_FAULTS"
MAX_BYTES = 4096  # a fault plan is a few lines of JSON


class Delay(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    seconds: float = Field(ge=0.0, le=60.0)  # slept per step, before the replica sync
    replicas: list[int] | None = Field(default=None, max_length=64)  # None: every replica


class FaultPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    delays: list[Delay] = Field(default_factory=list, max_length=16)
    kill_at_step: int | None = Field(default=None, ge=1, le=1_000_000_000)  # steps committed, then SIGKILL
    drop: list[PeerId] = Field(default_factory=list, max_length=256)

    def delay_s(self, replica: int) -> float:
        """Seconds a peer of ``replica`` sleeps per step (the delays that name it, added up)."""
        return sum(d.seconds for d in self.delays if d.replicas is None or replica in d.replicas)

    def dropped(self) -> frozenset[str]:
        return frozenset(self.drop)


NO_FAULTS = FaultPlan()


def read_faults(environ: Mapping[str, str] | None = None) -> FaultPlan:
    """The fault plan of this process (``POTLUCK_FAULTS``), or the empty plan when it is unset."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return NO_FAULTS
    if len(raw.encode()) > MAX_BYTES:
        raise FaultError(f"{ENV} is longer than {MAX_BYTES} bytes")
    try:
        return FaultPlan.model_validate_json(raw)
    except ValidationError as e:
        raise FaultError(
            f"{ENV} is not a fault plan: {e.errors()[0]['msg']} at {e.errors()[0]['loc']}"
        ) from None
