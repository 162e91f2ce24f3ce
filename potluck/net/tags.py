"""The one message-tag layout: every sender and receiver of the mailbox asks this module for its ``Tag``.

A tag is 17 bytes on the wire, little-endian, ahead of each message's payload::

    round      u64   a packed Round: epoch 27 bits | step 30 | phase 4 | attempt 3  (high to low)
    stream     u32   kind 8 bits (a Stream) | index 24 bits (tree number, ring segment; else 0)
    chunk      u32   the pipeline's micro-batch, a collective's chunk, a ring's step
    direction  u8    a Direction: REDUCE or BROADCAST for collectives, NONE for point-to-point

Why these widths: plan epochs are < 2^27 (``TrainPlan.epoch``), steps <= 10^9 < 2^30 (``JobSpec.steps``),
a step has at most 16 phases (its pipeline and commit, DiLoCo's outer sync, 14 gradient buckets) and a
relaxed round at most 8 attempts. Values out of range raise ``WireError`` instead of spilling into the
next field, where they would silently alias another step's messages.

Packed rounds order like (epoch, step, phase, attempt) tuples, so "everything before step s of epoch e"
and "every attempt of one round" are each one interval of integers (``RoundSpan``). The mailbox forgets
spans, never "all rounds up to r": a finished step or collective cannot drop a later one's early arrivals.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from enum import IntEnum

from potluck.protocol.errors import WireError

EPOCH_BITS, STEP_BITS, PHASE_BITS, ATTEMPT_BITS = 27, 30, 4, 3  # 64 bits in all
KIND_BITS, INDEX_BITS = 8, 24  # the stream field's 32 bits
ATTEMPTS = 1 << ATTEMPT_BITS  # attempts of one round (relaxed all-reduce retries)

_STEP_SHIFT = PHASE_BITS + ATTEMPT_BITS
_EPOCH_SHIFT = STEP_BITS + _STEP_SHIFT
_WIRE = struct.Struct("<QIIB")
TAG_BYTES = _WIRE.size


def _check(what: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise WireError(f"message tag {what} {value} does not fit its {bits} bits (0 <= {what} < 2^{bits})")


class Phase(IntEnum):
    """What a round carries inside one training step (the round's 4 phase bits)."""

    STEP = 0  # the 1F1B pipeline and the step commit (told apart by their streams)
    OUTER = 1  # DiLoCo's outer sync of the pseudo-gradient
    BUCKETS = 2  # gradient bucket b all-reduces in phase BUCKETS + b


BUCKET_PHASES = (1 << PHASE_BITS) - Phase.BUCKETS  # gradient buckets one step can tag: 14


class Stream(IntEnum):
    """Which conversation a message belongs to (the high 8 bits of the stream field)."""

    DATA = 0  # plain transfers of tests and benchmarks
    ACTIVATIONS = 1  # pipeline, stage j -> j + 1; chunk = micro-batch
    ACTIVATION_GRADS = 2  # pipeline, stage j + 1 -> j; chunk = micro-batch
    COMMIT_READY = 3  # step commit, peer -> leader
    COMMIT_DECISION = 4  # step commit, leader -> peer
    TREE = 5  # tree all-reduce (whole buffers and gradient buckets); index = tree, chunk = chunk
    RING = 6  # ring all-reduce; index = segment, chunk = ring step
    RELAXED_READY = 7  # relaxed all-reduce control, peer -> leader, per attempt
    RELAXED_DECISION = 8  # leader -> peer: this attempt's members
    RELAXED_DONE = 9  # member -> leader: the attempt's all-reduce succeeded or failed
    RELAXED_VERDICT = 10  # leader -> member: commit or retry
    CATCHUP = 11  # relaxed round leader -> a replica left out of it: the committed mean
    START_READY = 12  # start barrier, peer -> leader: this peer holds the plan's starting state
    START_GO = 13  # start barrier, leader -> peer: every peer of the plan does; run the first step
    SPOT_EVIDENCE = 14  # pipeline neighbour -> checker: sealed messages of a checked micro-batch
    AUDIT_EVIDENCE = 15  # shard owner -> auditor: the sealed rows of an audited chunk; index = tree
    GONE = 16  # mailbox -> its plan's peers: this peer's stream ended and it refuses connections
    GATHER = 17  # DiLoCo coded outer sync, replica -> each other replica of its stage; chunk = part
    GATHER_ECHO = 18  # robust outer sync: a replica's digests of every member's gathered payloads
    GATHER_DECISION = 19  # outer sync under a deadline: the leader's bitmask of the replicas in it
    SEAL = 20  # a checked step's seal, sender -> each receiver: the signed Merkle root and its proofs
    COMMIT_ASK = 21  # step commit, peer -> peer: what did the leader decide? (it missed the decision)
    COMMIT_ANSWER = 22  # the answer: the leader's signed decision as it came, or empty
    STEP_ABORT = 23  # step commit, leader -> peer: the step will not commit; stop waiting on it


class Direction(IntEnum):
    NONE = 0  # point-to-point messages
    REDUCE = 1  # towards a tree's root; a ring's reduce-scatter
    BROADCAST = 2  # away from the root; a ring's all-gather


@dataclass(frozen=True, order=True)
class Round:
    """One round of messages; orders like its packed form."""

    epoch: int
    step: int
    phase: int = Phase.STEP
    attempt: int = 0

    def __post_init__(self) -> None:
        _check("epoch", self.epoch, EPOCH_BITS)
        _check("step", self.step, STEP_BITS)
        _check("phase", self.phase, PHASE_BITS)
        _check("attempt", self.attempt, ATTEMPT_BITS)

    def pack(self) -> int:
        high = (self.epoch << _EPOCH_SHIFT) | (self.step << _STEP_SHIFT)
        return high | (self.phase << ATTEMPT_BITS) | self.attempt

    @classmethod
    def unpack(cls, value: int) -> Round:
        _check("round", value, 64)
        return cls(
            value >> _EPOCH_SHIFT,
            (value >> _STEP_SHIFT) & ((1 << STEP_BITS) - 1),
            (value >> ATTEMPT_BITS) & ((1 << PHASE_BITS) - 1),
            value & (ATTEMPTS - 1),
        )

    def at(self, phase: int) -> Round:
        """The same step in another phase (first attempt)."""
        return replace(self, phase=phase, attempt=0)

    def bucket(self, b: int) -> Round:
        """The round of gradient bucket ``b`` of this step."""
        if not 0 <= b < BUCKET_PHASES:
            raise WireError(f"gradient bucket {b} has no tag phase (a step tags at most {BUCKET_PHASES})")
        return self.at(Phase.BUCKETS + b)

    def retry(self, attempt: int) -> Round:
        """Attempt ``attempt`` of this round."""
        return replace(self, attempt=attempt)

    def attempts(self) -> RoundSpan:
        """Every attempt of this (epoch, step, phase), and nothing else."""
        first = replace(self, attempt=0).pack()
        return RoundSpan(first, first + ATTEMPTS)

    def __str__(self) -> str:
        return f"e{self.epoch}/s{self.step}/p{self.phase}/a{self.attempt}"


@dataclass(frozen=True)
class RoundSpan:
    """Packed rounds ``start <= r < stop``: what the mailbox forgets at once."""

    start: int
    stop: int

    def __contains__(self, round_no: object) -> bool:
        return isinstance(round_no, int) and self.start <= round_no < self.stop


def before(epoch: int, step: int = 0) -> RoundSpan:
    """Every round earlier than step ``step`` of epoch ``epoch``: finished steps, older plans."""
    return RoundSpan(0, Round(epoch, step).pack())


@dataclass(frozen=True, order=True)
class Tag:
    """A message's address within the traffic between two peers (the raw wire fields)."""

    round: int  # a packed Round
    stream: int = 0  # kind << 24 | index
    chunk: int = 0
    direction: int = Direction.NONE

    def __post_init__(self) -> None:
        _check("round", self.round, 64)
        _check("stream", self.stream, KIND_BITS + INDEX_BITS)
        _check("chunk", self.chunk, 32)
        _check("direction", self.direction, 8)

    def pack(self) -> bytes:
        return _WIRE.pack(self.round, self.stream, self.chunk, self.direction)

    @classmethod
    def unpack(cls, data: bytes) -> Tag:
        """The tag at the start of ``data`` (at least ``TAG_BYTES`` long)."""
        return cls(*_WIRE.unpack_from(data))

    def __str__(self) -> str:
        kind, index = self.stream >> INDEX_BITS, self.stream & ((1 << INDEX_BITS) - 1)
        name = Stream(kind).name.lower() if kind in set(Stream) else str(kind)
        return f"<{Round.unpack(self.round)} {name}[{index}] chunk {self.chunk} dir {self.direction}>"


def make_tag(
    round_no: Round | int,
    stream: Stream,
    *,
    index: int = 0,
    chunk: int = 0,
    direction: Direction = Direction.NONE,
) -> Tag:
    """The tag of one message: ``round_no`` a Round or its packed form; ``index`` the tree or segment."""
    _check("stream index", index, INDEX_BITS)
    packed = round_no.pack() if isinstance(round_no, Round) else round_no
    return Tag(packed, (int(stream) << INDEX_BITS) | index, chunk, direction)
