"""The root of every error potluck raises on purpose, and the map of the whole tree.

Each package keeps its own errors in its own ``errors.py``; every one of them descends from
``PotluckError``, so an entry point can catch one type and print the message, which always says what
went wrong and what to try::

    PotluckError
    ├── ProtocolError            potluck.protocol.errors: records, invites, job files, frames, checkpoints
    │   ├── IdentityError, RecordError, InviteError, JobSpecError
    │   ├── BootstrapError, WireError
    │   └── CheckpointError
    ├── CompressionError         potluck.compression.errors: specs, encode, decode
    │   ├── SpecError, EncodeError (NonFiniteError), DecodeError
    ├── ModelError               potluck.model.errors: what is trained on one machine
    │   └── DataError, DeviceError
    ├── CoordinatorError         potluck.coordinator.errors: scenarios, link models, planning, packing
    │   ├── ScenarioError, NetModelError, PlanningError, PackingError
    ├── PeerError                potluck.peer.errors: the networked step
    │   ├── CollectiveError (LateError), PipelineError, StepAborted
    │   ├── StateError (TransferError)    fetching a stage's state from disk or live holders
    │   └── TrainingFailed
    ├── TestbedError             potluck.testbed.errors: the emulated WAN (root, TUN, scenario files)
    ├── TaskFailed               here: a supervised task (potluck.aio) raised; its error is the cause
    └── DeadlineExceeded         here: a bounded wait (potluck.aio.bounded) ran out; also a TimeoutError

Errors that are also ``ValueError`` (bad specs, bad data) stay catchable as such by generic callers.
"""

from __future__ import annotations


class PotluckError(Exception):
    """Base class of every error potluck raises deliberately; the message is meant for a user."""


class TaskFailed(PotluckError):
    """A task run by ``potluck.aio`` raised; the message names the task, ``__cause__`` is its error."""

    def __init__(self, task: str, error: BaseException) -> None:
        super().__init__(f"task {task!r} failed: {type(error).__name__}: {error}")
        self.task = task


class DeadlineExceeded(PotluckError, TimeoutError):
    """A bounded wait ran out of time; the message says what did not finish and within how long.

    It is a ``TimeoutError`` too, so code that catches timeouts keeps working."""
