"""Records of a running job: the coordinator's signed plan and each peer's signed progress.

A ``TrainPlan`` says who runs which layers: ``stages[j].peers[i]`` is the peer running stage j of
pipeline (replica) i. Plans carry an ``epoch`` that grows with every re-plan; peers act only on the
highest epoch they have verified, so a stale or replayed plan cannot pull them back. A peer that is
not placed learns why from ``spares``.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from potluck.protocol.jobspec import AggregationRule, CompressionSpec, JobSpec
from potluck.protocol.records import Name, NonNegFloat, PeerId, Record, ShortText, canonical_json

Seconds = Annotated[float, Field(ge=0.0, le=1e9, allow_inf_nan=False)]


class TreeRecord(BaseModel):
    """One spanning tree of a stage's all-reduce: ``parents[i]`` is replica i's parent (-1: the root)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    share: float = Field(gt=0.0, le=1.0)  # fraction of the buffer this tree carries
    parents: list[int] = Field(min_length=1, max_length=4096)


class StageAssignment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    first_layer: int = Field(ge=0, le=1024)
    last_layer: int = Field(ge=1, le=1024)  # exclusive
    peers: list[PeerId] = Field(min_length=1, max_length=4096)  # index = replica (pipeline) number
    trees: list[TreeRecord] = Field(default_factory=list, max_length=64)  # empty: one-hop trees
    aggregation: AggregationRule = "mean"
    # Tick-tock co-location (docs/ticktock.md): ``waves[i]`` is how many replicas' shares of the batch
    # peer i runs, as staggered waves on its one device (1 or 2). The stage then trains on sum(waves)
    # data shards; peer i holds shards sum(waves[:i]) ... + waves[i] - 1. None (not written, so plans
    # without co-location sign and read as before): one each.
    waves: list[int] | None = Field(default=None, min_length=1, max_length=4096)

    @model_serializer(mode="wrap")
    def _omit_default_waves(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        if out.get("waves", 0) is None:
            del out["waves"]
        return out

    @model_validator(mode="after")
    def _trees_span_the_group(self) -> StageAssignment:
        n = len(self.peers)
        if self.waves is not None and (len(self.waves) != n or any(w not in (1, 2) for w in self.waves)):
            raise ValueError(f"waves needs one entry of 1 or 2 per replica ({n}), got {self.waves}")
        if self.aggregation != "mean" and self.trees:
            raise ValueError(f"aggregation {self.aggregation!r} needs one-hop trees (an empty tree list)")
        for t in self.trees:
            if len(t.parents) != n or sum(p == -1 for p in t.parents) != 1:
                raise ValueError("each tree needs one parent entry per replica and exactly one root")
            if any(not -1 <= p < n or p == i for i, p in enumerate(t.parents)):
                raise ValueError("tree parents must name another replica of the stage")
        return self


# A codec chain as ``potluck.compression`` spells it ("int4:block=32|zstd"); the protocol cannot parse it
# (it does not import the codecs): the coordinator writes only chains ``get_codec`` accepts, and a peer
# refuses a plan whose chain it cannot build before it trains a step.
Chain = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.:=,|+\- ]+$")]
MAX_LINK_CHAINS = 16  # distinct chains one plan may name for its links
ChainIndex = Annotated[int, Field(ge=0, lt=MAX_LINK_CHAINS)]  # into LinkCodecs.chains
LinkRow = Annotated[list[ChainIndex], Field(min_length=1, max_length=4096)]  # one entry per replica


class LinkCodecs(BaseModel):
    """The activation codecs of a plan's pipeline links. ``chains`` names them once; ``forward[j][i]``
    indexes the chain of the activations replica i of stage j sends replica i of stage j + 1, and
    ``backward[j][i]`` that of the gradients sent back over the same pair (indices keep a large plan
    within one DHT value: a byte or two per link and direction)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chains: list[Chain] = Field(min_length=1, max_length=MAX_LINK_CHAINS)
    forward: list[LinkRow] = Field(min_length=1, max_length=1023)  # one row per stage boundary
    backward: list[LinkRow] = Field(min_length=1, max_length=1023)

    @model_validator(mode="after")
    def _indices_name_chains(self) -> LinkCodecs:
        n = len(self.chains)
        if len(set(self.chains)) != n:
            raise ValueError("link codec chains repeat")
        if any(k >= n for row in (*self.forward, *self.backward) for k in row):
            raise ValueError(f"a link codec index is past the {n} chains named")
        return self

    def chain(self, boundary: int, replica: int, backward: bool) -> str:
        return self.chains[(self.backward if backward else self.forward)[boundary][replica]]


class Spare(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    peer_id: PeerId
    reason: ShortText


class StateHolder(BaseModel):
    """A live peer that holds layers [first_layer, last_layer) of a plan's start step in memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    peer_id: PeerId
    first_layer: int = Field(ge=0, le=1024)
    last_layer: int = Field(ge=1, le=1024)


class TrainPlan(Record):
    """Signed by the coordinator, stored under the plan key (one value, no subkey)."""

    KIND: ClassVar[str] = "TrainPlan"

    job: Name
    epoch: int = Field(ge=0, lt=2**27)  # < 2^27: peers pack (epoch, step) into 64-bit message tags
    status: Literal["training", "done"] = "training"
    start_step: int = Field(ge=0, le=10**9)  # the step this plan's swarm trains first (resume point)
    stages: list[StageAssignment] = Field(min_length=1, max_length=1024)
    micro_batches: int = Field(ge=1, le=1 << 20)  # per replica per step
    spares: list[Spare] = Field(default_factory=list, max_length=4096)
    predicted_step_s: Seconds = 0.0
    # Extra warm-up forwards every stage but the last runs before its first backward
    # (``peer/train/schedule.py``): enough micro-batches in flight to cover the slowest boundary's round
    # trip on slow links.
    run_ahead: int = Field(default=0, ge=0, le=64)
    # Where start_step's state is: in live peers' memory ("live": replicas of every stage survived) or in
    # checkpoints only ("checkpoint": some stage lost every replica). Peers ask the likelier holders first.
    resume_from: Literal["live", "checkpoint"] = "live"
    # A pause (several jobs on one swarm, docs/multijob.md): the placed peers stop after this step, each
    # with a checkpoint of it, and the job waits for its lease to give it enough peers again. Set by
    # re-publishing the running epoch; None (the default, left out of the signed bytes so that peers of
    # an older version still read every plan that does not pause): train to the job's last step.
    stop_at: int | None = Field(default=None, ge=1, le=10**9)
    # Per-link activation codecs (the job's ``compression.activations_slow``, coordinator/job/codecs.py).
    # None (the default, left out of the signed bytes as older versions sign and read it): every link
    # uses the job's ``compression.activations``.
    link_codecs: LinkCodecs | None = None
    # Where a job with ``model.bottleneck_rank`` has its bottlenecks (model/bottleneck.py): fixed by the
    # first plan's cuts and kept by every later one, so a re-plan that moves the cuts keeps the learned
    # maps. None (the default, left out of the signed bytes as older versions sign and read it): this
    # plan's own cuts.
    bottlenecks: list[int] | None = Field(default=None, max_length=1024)
    # Peers of this plan the coordinator declared gone (heartbeat lapsed, or unreachable and silent)
    # while it cannot re-plan without them: the other peers stop dialling them at once. ``waiting``: why
    # no new plan comes yet ("waiting for peers: 3 live, 4 needed to hold the model"), shown on every
    # peer's line. Both set by re-publishing the running epoch; empty and None (the defaults, left out of
    # the signed bytes as older versions sign and read it) on every plan that lost nobody.
    gone: list[PeerId] = Field(default_factory=list, max_length=1024)
    waiting: ShortText | None = None
    # The compression this plan runs with, for a job with ``compression = "auto"``: the coordinator's
    # choice from the measured links (coordinator/job/autocomp.py); every peer trains with it instead of
    # the job's own section (``under``). None (the default, left out of the signed bytes as older
    # versions sign and read it): the job's section.
    compression: CompressionSpec | None = None
    # Who holds the start step's layers in memory, as the coordinator knows from the peers' reports
    # (``Progress.holds``, ``.also_holds``): the plan's peers ask them besides the recent plans' peers,
    # whose layers then may have been others (a piece kept from an older layer cut). ``behind``: the
    # newest step a live peer holds, when the plan starts before it because no live peer holds that
    # step's every layer (a stage's last holder died), so the peer holding it does not take the plan
    # for one made from stale reports. Empty and None (the defaults, left out of the signed bytes as
    # older versions sign and read it) on a plan that starts from the newest state.
    holders: list[StateHolder] = Field(default_factory=list, max_length=4096)
    behind: int | None = Field(default=None, ge=0, le=10**9)
    issued_at: NonNegFloat

    @model_validator(mode="after")
    def _consistent(self) -> TrainPlan:
        width = len(self.stages[0].peers)
        expect_first = 0
        seen: set[str] = set()
        for j, st in enumerate(self.stages):
            if st.first_layer != expect_first or st.last_layer <= st.first_layer:
                raise ValueError(f"stage {j} layers [{st.first_layer}, {st.last_layer}) do not follow on")
            expect_first = st.last_layer
            if len(st.peers) != width:
                raise ValueError(f"stage {j} has {len(st.peers)} replicas, stage 0 has {width}")
            if seen & set(st.peers) or len(set(st.peers)) != len(st.peers):
                raise ValueError(f"stage {j} repeats a peer: a peer runs at most one stage")
            seen |= set(st.peers)
        if len(self.stages) > 1 and any(st.waves is not None for st in self.stages):
            # a wave runs the whole model from tokens to loss (peer/train/waves.py); waves of a middle
            # stage would need two pipelines' activations on one peer, which no executor runs yet
            raise ValueError("waves (tick-tock replicas) need a one-stage plan")
        if not set(self.gone) <= seen:
            raise ValueError("a plan declares gone only peers it places")
        n_layers = self.stages[-1].last_layer
        if any(not 0 <= h.first_layer < h.last_layer <= n_layers for h in self.holders):
            raise ValueError(f"a state holder's layers are outside [0, {n_layers}) or empty")
        if self.behind is not None and self.behind <= self.start_step:
            raise ValueError(f"behind {self.behind} is not past the plan's start step {self.start_step}")
        if self.stop_at is not None and self.stop_at < self.start_step:
            raise ValueError(f"stop_at {self.stop_at} is before the plan's start step {self.start_step}")
        self._links_fit(width)
        if self.bottlenecks is not None:
            n, ks = self.stages[-1].last_layer, self.bottlenecks
            if ks != sorted(set(ks)) or not all(0 < k < n for k in ks):
                raise ValueError(f"bottleneck positions {ks} must be increasing, inside (0, {n})")
        return self

    def _links_fit(self, width: int) -> None:
        links = self.link_codecs
        if links is None:
            return
        boundaries = len(self.stages) - 1
        if len(links.forward) != boundaries or len(links.backward) != boundaries:
            raise ValueError(f"link codecs must have one row per stage boundary ({boundaries})")
        if any(len(row) != width for row in (*links.forward, *links.backward)):
            raise ValueError(f"link codec rows need one entry per replica ({width})")

    def canonical_bytes(self) -> bytes:
        body = self.model_dump(mode="json")
        for key in ("stop_at", "link_codecs", "bottlenecks", "waiting", "compression", "behind"):
            if body.get(key) is None:
                body.pop(key, None)  # as older versions sign and read it
        for key in ("gone", "holders"):
            if not body.get(key):
                body.pop(key, None)
        return canonical_json(body)

    def link_chain(self, boundary: int, replica: int, backward: bool, default: str) -> str:
        """The chain coding boundary ``boundary``'s (stage j -> j + 1) transfers of ``replica``:
        activations forward, or (``backward``) their gradients; ``default`` (the job's) when the
        plan names none."""
        if self.link_codecs is None:
            return default
        return self.link_codecs.chain(boundary, replica, backward)

    def under(self, job: JobSpec) -> JobSpec:
        """``job`` as this plan runs it: with the compression the coordinator chose for it, if any."""
        if self.compression is None:
            return job
        return job.model_copy(update={"compression": self.compression})

    @property
    def cuts(self) -> tuple[int, ...]:
        """The layer boundaries this plan cuts the pipeline at (every stage's first layer but the first)."""
        return tuple(st.first_layer for st in self.stages[1:])

    @property
    def bottleneck_cuts(self) -> tuple[int, ...]:
        """Where a job with a bottleneck has it under this plan: ``bottlenecks``, else the plan's cuts."""
        return self.cuts if self.bottlenecks is None else tuple(self.bottlenecks)

    @property
    def n_layers(self) -> int:
        return self.stages[-1].last_layer

    @property
    def n_replicas(self) -> int:
        return len(self.stages[0].peers)

    @property
    def data_replicas(self) -> int:
        """How many data shards each step's batch is split into: the replicas, counting each of a
        co-located peer's waves as one (``StageAssignment.waves``)."""
        waves = self.stages[0].waves
        return self.n_replicas if waves is None else sum(waves)

    def shards(self, stage: int, replica: int) -> range:
        """The data shards replica ``replica`` of ``stage`` trains on: one, or one per wave."""
        waves = self.stages[stage].waves
        if waves is None:
            return range(replica, replica + 1)
        first = sum(waves[:replica])
        return range(first, first + waves[replica])

    @property
    def leader(self) -> str:
        """The peer that commits steps (stage 0, replica 0)."""
        return self.stages[0].peers[0]

    def copy_holder(self, stage: int) -> str | None:
        """The peer that keeps a second copy of ``stage``'s checkpoints when the stage has one replica:
        replica 0 of the next stage (cyclically). None when the stage has replicas (each writes its own
        copy) or the plan has no other stage. No disk is shared, so without it a checkpoint of a
        one-replica stage would live only on that one peer's disk."""
        n = len(self.stages)
        if self.n_replicas > 1 or n < 2:
            return None
        return self.stages[(stage + 1) % n].peers[0]

    @property
    def peers(self) -> frozenset[str]:
        """Every placed peer (spares excluded): the peers whose messages this plan's peers accept."""
        return frozenset(p for st in self.stages for p in st.peers)

    def position(self, peer_id: str) -> tuple[int, int] | None:
        """(stage, replica) of ``peer_id``, or None when it is not placed."""
        for j, st in enumerate(self.stages):
            if peer_id in st.peers:
                return j, st.peers.index(peer_id)
        return None


class StepTiming(BaseModel):
    """Where one peer's wall time of one step went, seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    compute: Seconds = 0.0  # forward + backward + optimizer
    send: Seconds = 0.0  # encoding and handing activations/gradients to the transport
    recv: Seconds = 0.0  # waiting for and decoding activations/gradients
    allreduce: Seconds = 0.0  # replica synchronisation not hidden under compute
    idle: Seconds = 0.0  # the rest: commit barrier, bubbles
    total: Seconds = 0.0
    # Per micro-batch means (peer/train/pipeline.py, Timing): activations sent -> their gradient back
    # and decoded (stages with a next), and activations here -> their gradient sent (with a previous)
    round_trip: Seconds = 0.0
    hold: Seconds = 0.0


ProgressState = Literal["waiting", "training", "done", "failed"]


class Holding(BaseModel):
    """Layers [first_layer, last_layer) of a job after ``step`` steps: what a peer holds, in memory (live
    state it serves) or on its disk (checkpoints and the copies it keeps)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0, le=10**9)
    first_layer: int = Field(ge=0, le=1024)
    last_layer: int = Field(ge=1, le=1024)

    @property
    def range(self) -> tuple[int, int]:
        return self.first_layer, self.last_layer

    @model_validator(mode="after")
    def _ordered(self) -> Holding:
        if self.last_layer <= self.first_layer:
            raise ValueError(f"layers [{self.first_layer}, {self.last_layer}) are empty")
        return self


class Witness(BaseModel):
    """What this peer's aggregation rule made of another replica's contributions in this run (chunks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    peer_id: PeerId
    seen: int = Field(ge=0, le=2**40)
    outlying: int = Field(ge=0, le=2**40)  # refused (NaN/Inf) or far outside the others (clipped)
    # Pipeline spot checks (peer/train/checks/spot.py): its micro-batches this peer recomputed, and mismatches
    checked: int = Field(default=0, ge=0, le=2**40)
    failed: int = Field(default=0, ge=0, le=2**40)
    # Audits of its aggregation as a shard owner (peer/train/checks/audit.py) whose evidence never came
    withheld: int = Field(default=0, ge=0, le=2**40)


class Progress(Record):
    """A peer's latest completed step. Stored under the progress key, subkey = peer id."""

    KIND: ClassVar[str] = "Progress"

    peer_id: PeerId
    job: Name
    epoch: int = Field(ge=0, lt=2**27)
    stage: int = Field(ge=0, le=1024)
    replica: int = Field(ge=0, le=100_000)
    step: int = Field(ge=0, le=10**9)  # steps completed (the next step to run)
    loss: float | None = Field(default=None, ge=0.0, le=1e6)  # the swarm's loss of the last step
    tokens_per_s: NonNegFloat = 0.0  # the swarm's tokens per second over the recent steps
    timing: StepTiming = Field(default_factory=StepTiming)
    bytes_sent_per_step: int = Field(default=0, ge=0, le=2**50)
    checkpoint_step: int | None = Field(default=None, ge=0, le=10**9)  # latest checkpoint written
    state: ProgressState = "training"
    message: ShortText = ""
    # With state "failed": peers this peer could not dial, write to or hear from in time. A hint for the
    # coordinator, which re-plans without one only if it has not heartbeated since ``issued_at``.
    suspects: list[PeerId] = Field(default_factory=list, max_length=16)
    # The live state this peer holds in memory and serves (None: none). Usually its stage at ``step``;
    # after a run that failed before taking its state, the layers it held before: the coordinator
    # resumes from live state only when what live peers hold covers every layer at one step.
    holds: Holding | None = None
    # More live state it holds from an earlier run at the same step (other layers than ``holds``): a
    # peer moved to a narrower stage still serves the wider layers it had until a newer step commits.
    also_holds: list[Holding] = Field(default_factory=list, max_length=4)
    # The checkpoints this peer keeps on its disk (its own stages and the copies it holds), newest of
    # each layer range: where the swarm can resume from when live state is lost.
    stored: list[Holding] = Field(default_factory=list, max_length=16)
    # The reporter's signed testimony on its stage's other replicas under this plan: how many of their
    # contributions it aggregated and how many it refused or clipped (coordinator/job/accuse.py).
    witnessed: list[Witness] = Field(default_factory=list, max_length=64)
    # fp32 bytes per wire byte of the activations and activation gradients it sent in its last step
    # (``StepReport.activation_ratio``): the planner prices links with it instead of the codec's own
    # estimate. None (the default, left out of the signed bytes as older versions sign it): unmeasured.
    activation_ratio: float | None = Field(default=None, gt=0.0, le=1e6, allow_inf_nan=False)
    issued_at: NonNegFloat

    def canonical_bytes(self) -> bytes:
        body = self.model_dump(mode="json")
        if body.get("activation_ratio") is None:
            body.pop("activation_ratio", None)
        return canonical_json(body)


def stage_run_ahead(n_stages: int, run_ahead: int) -> list[int]:
    """The extra micro-batches each stage keeps in flight under a plan's ``run_ahead``: every stage but
    the last, which has no round trip to cover (``peer/train/schedule.py``, ``warmups``)."""
    return [run_ahead if s < n_stages - 1 else 0 for s in range(n_stages)]


# Which of the trust checks a plan runs (docs/security.md): peers run them and the coordinator weighs
# their testimony, so both read the same rules here.
def spot_checked(job: JobSpec, plan: TrainPlan) -> bool:
    """Whether the plan's pipeline messages are sealed and spot-checked: a job asking for checks,
    a pipeline to check and replicas to check it, weights equal across replicas (no local steps)."""
    return (
        job.trust.spot_checks > 0
        and len(plan.stages) > 1
        and plan.n_replicas > 1
        and plan.under(job).compression.sync_every == 1
    )


def audited(job: JobSpec, plan: TrainPlan, stage: int) -> bool:
    """Whether the stage's shard owners are audited: a robust rule (one-hop trees), three replicas
    or more (an owner and two auditors), checks asked for, the strict sync policy without local
    steps (the bucketed all-reduce is what seals its contributions)."""
    return (
        job.trust.spot_checks > 0
        and plan.stages[stage].aggregation != "mean"
        and plan.n_replicas >= 3
        and plan.under(job).compression.sync_every == 1
        and job.sync.policy == "strict"
    )


def gradients_rechecked(job: JobSpec, plan: TrainPlan, stage: int) -> bool:
    """Whether replicas confirm the contributions their rule finds outlying by recomputing the
    suspect's step (``peer/train/checks/recheck.py``): an audited stage that holds the whole model. Where
    they do, outlying testimony alone convicts nobody; elsewhere it does."""
    return audited(job, plan, stage) and len(plan.stages) == 1
