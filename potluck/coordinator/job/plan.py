"""From the live swarm and the job to a signed-ready ``TrainPlan``. Pure: records in, a plan out.

Peers' measured TFLOP/s (bf16 on CUDA, fp32 elsewhere) and free memory become the planner's devices;
their link reports become the network model (uniform defaults when no link was measured yet, which
the reason says). Peers that cannot hold even one layer are set aside first, each told why. The
planner picks the shape, the placement and the layer split; each stage's replicas get all-reduce trees
packed over their measured links.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from potluck.coordinator.errors import NetModelError, PackingError
from potluck.coordinator.job.autocomp import pick
from potluck.coordinator.job.claims import believed_access, believed_tflops, plausible_tflops, tflops_ceiling
from potluck.coordinator.job.codecs import codec_ratios, select_link_codecs
from potluck.coordinator.job.colocation import (
    colocated_placement,
    pair_speedups,
    slot_profiles,
    unfold,
    why_not,
)
from potluck.coordinator.job.positions import keep_positions
from potluck.coordinator.placement import PlacementPlan, PlannerConfig, PlanningState, plan
from potluck.coordinator.placement.costmodel import (
    BatchSpec,
    DeviceSpec,
    ModelShape,
    StepBreakdown,
    StepJob,
    directed_bandwidth,
    layer_memory,
    link_weight,
    micro_batch_flops,
    micro_batches,
    peers_to_hold,
    step_time,
)
from potluck.coordinator.placement.netmodel import (
    AccessCapacity,
    NetModel,
    build_netmodel,
    from_matrices,
    slow_pairs,
)
from potluck.coordinator.placement.objectives import StepObjective
from potluck.coordinator.state import SwarmState
from potluck.coordinator.trees.plan import choose_tree_plan, to_schedule
from potluck.protocol.collective import schedule_to_records
from potluck.protocol.jobspec import CompressionSpec, JobSpec
from potluck.protocol.records import PeerRecord
from potluck.protocol.training import (
    LinkCodecs,
    Spare,
    StageAssignment,
    TrainPlan,
    TreeRecord,
    stage_run_ahead,
)

logger = logging.getLogger(__name__)

DEFAULT_RTT_MS, DEFAULT_GBPS = 2.0, 1.0  # assumed for pairs when no link has been measured at all
# Planning divides a relayed pair's bandwidth by this. A relay carries the pair's bytes on its own
# uplink (slowing whatever else it sends), p2pd resets a circuit after 4 GiB or 30 min, the extra hop
# lengthens every round trip, and in the WAN testbed bulk exchanges over circuits were reset mid-step
# (docs/benchmarks.md, "Home NAT"): bulk belongs on direct links wherever a plan within 10x exists.
RELAYED_SLOWDOWN = 10.0


def public_leader(placement: PlacementPlan, natted: set[str]) -> PlacementPlan:
    """The placement with its pipelines reordered so that the leader (stage 0 of pipeline 0: every
    peer sends it its step's commit messages) is a public peer where stage 0 has one. Pipelines are
    interchangeable, so the cost is unchanged; a NATed leader would hear every other NATed peer through
    a relay."""
    first = placement.stages[0]
    if first[0] not in natted:
        return placement
    public = [r for r, p in enumerate(first) if p not in natted]
    if not public:
        return placement
    order = [public[0], *(r for r in range(len(first)) if r != public[0])]
    stages = tuple(tuple(row[r] for r in order) for row in placement.stages)
    return replace(placement, stages=stages)


def relayed_pairs(state: SwarmState, peers: list[str]) -> set[tuple[int, int]]:
    """Index pairs (i < j) of ``peers`` whose traffic runs through a relay: measured so by either end
    (``LinkSample.relayed``), or, where no probe between them says otherwise, both behind a NAT (a
    NATed peer dials public peers itself, ``net/reachout.py``, so only two NATed ones need a relay)."""
    index = {p: i for i, p in enumerate(peers)}
    seen: dict[tuple[int, int], bool] = {}  # pair -> any measurement says relayed
    for rep in state.links.values():
        for s in rep.links:
            if rep.peer_id in index and s.dst in index and rep.peer_id != s.dst:
                a, b = sorted((index[rep.peer_id], index[s.dst]))
                seen[(a, b)] = seen.get((a, b), False) or s.relayed
    natted = [i for i, p in enumerate(peers) if p in state.peers and state.peers[p].record.behind_nat]
    assumed = {(a, b) for k, a in enumerate(natted) for b in natted[k + 1 :] if (a, b) not in seen}
    return {pair for pair, relayed in seen.items() if relayed} | assumed


def _planner_defaults() -> PlannerConfig:
    return PlannerConfig(time_limit_s=2.0, bound_time_limit_s=0.5)


@dataclass(frozen=True)
class JobPlanConfig:
    planner: PlannerConfig = field(default_factory=_planner_defaults)
    max_trees_per_stage: int = 8


def keep_bottlenecks(job: JobSpec, positions: Sequence[int] | None, plan: TrainPlan) -> TrainPlan:
    """``plan`` with the job's bottleneck positions (``TrainPlan.bottlenecks``, model/bottleneck.py):
    ``positions``, those earlier plans fixed, so a re-plan that moves the cuts keeps the maps the swarm
    has learned; None (the first plan): its own cuts. Unchanged for a job without
    ``model.bottleneck_rank``."""
    if job.model.bottleneck_rank is None:
        return plan
    return plan.model_copy(update={"bottlenecks": list(plan.cuts if positions is None else positions)})


def step_job(job: JobSpec, measured_ratios: Mapping[str, float] | None = None) -> StepJob:
    """The planner's view of the job: fp32 weights + grads + AdamW moments (16 B/param), no recompute.
    Links are priced at the codec each will use (``codecs.codec_ratios``): the ratio the peers measured
    on the job where ``measured_ratios`` (fp32 bytes per wire byte per chain) has it, else the codec
    library's own estimate, times rank / d_model with a bottleneck at the cuts."""
    shape = ModelShape.from_spec(job.model)  # the spec's arithmetic, shared with the transformer
    width = job.model.boundary_width / job.model.d_model  # a bottleneck sends rank, not d_model, numbers
    ratios = codec_ratios(job.compression, measured_ratios, width)
    return StepJob(
        shape, BatchSpec(job.sequences_per_step, job.batch.micro_batch_size), ratios, recompute=False
    )


def device_of(record: PeerRecord) -> DeviceSpec:
    """The peer's device as it claims it, within what such hardware can do (``claims``)."""
    hw = record.hardware
    return DeviceSpec(tflops=plausible_tflops(hw), memory_gb=hw.memory_free_bytes / 1e9)


def network(state: SwarmState, peers: list[str]) -> tuple[NetModel, str]:
    inside = set(peers)
    measured = [
        (rep.peer_id, s.dst, max(s.rtt_ms, 1e-3), s.bandwidth_gbps)
        for rep in state.links.values()
        if rep.peer_id in inside
        for s in rep.links
        if s.dst in inside and s.bandwidth_gbps > 0
    ]
    access: dict[Hashable, AccessCapacity] = {
        p: cap for p, cap in believed_access(state.links).items() if p in inside
    }
    relayed = relayed_pairs(state, peers)
    slow = f", {len(relayed)} relayed pairs at 1/{RELAYED_SLOWDOWN:g} speed" if relayed else ""
    if measured:
        try:
            note = f"{len(measured)} measured links" + (
                f", {len(access)} declared access links" if access else ""
            )
            return slow_pairs(build_netmodel(peers, measured, access), relayed, RELAYED_SLOWDOWN), note + slow
        except NetModelError as e:
            logger.warning("link reports unusable (%s); assuming uniform links", e)
    n = len(peers)
    lat = np.full((n, n), DEFAULT_RTT_MS / 2)
    bw = np.full((n, n), DEFAULT_GBPS)
    np.fill_diagonal(lat, 0.0)
    assumed = f"no measured links yet: assumed {DEFAULT_GBPS} Gbit/s, {DEFAULT_RTT_MS} ms"
    return slow_pairs(from_matrices(lat, bw), relayed, RELAYED_SLOWDOWN), assumed + slow


def stage_trees(
    net: NetModel,
    index: dict[str, int],
    peers: tuple[str, ...],
    max_trees: int,
    nbytes: float,
    chunk_bytes: float = 1 << 20,
) -> list[TreeRecord]:
    """All-reduce trees for one stage's replicas, packed over their measured bandwidths."""
    if len(peers) < 2:
        return []
    ix = [index[p] for p in peers]
    cap = net.bandwidth_gbps[np.ix_(ix, ix)].copy()
    np.fill_diagonal(cap, 0.0)
    try:
        # bytes/s from Gbit/s; the buffer is the stage's gradients at the job's codec ratio (about 1 MB
        # per 250k fp32 parameters): only the ratio of fill to transfer matters for the choice.
        rates = (cap * 1e9 / 8).tolist()
        chosen = choose_tree_plan(
            list(range(len(peers))), rates, nbytes, chunk_bytes=chunk_bytes, max_trees=max_trees
        )
        sched = to_schedule(chosen)  # peers named "0", "1", ...
    except PackingError as e:
        logger.warning("tree packing failed (%s); the stage uses one-hop trees", e)
        return []
    return schedule_to_records(sched, [str(i) for i in range(len(peers))])


def usable_peers(state: SwarmState, job: JobSpec) -> tuple[list[str], list[Spare]]:
    """(live peers that can hold at least one layer of the job, the others each with the reason)."""
    sj = step_job(job)
    state_bytes, act_bytes = layer_memory(sj)
    one_layer_gb = (state_bytes + act_bytes) / 1e9
    spares: list[Spare] = []
    usable: list[str] = []
    for pid in sorted(state.peers):
        dev = device_of(state.peers[pid].record)
        if dev.memory_gb * sj.memory_headroom < one_layer_gb:
            why = f"too little memory: {dev.memory_gb:.2f} GB free, one layer needs {one_layer_gb:.2f} GB"
            spares.append(Spare(peer_id=pid, reason=why[:128]))
        else:
            usable.append(pid)
    return usable, spares


def short_of_memory(live: int, need: int | None) -> str:
    """What a running job waits for when its live peers cannot hold the model (the text the launch
    view, status and the dashboard show, and each peer's line)."""
    if live == 0:
        return "waiting for peers: none live that can hold a layer"
    if need is None:
        return f"waiting for peers: {live} live, and the model needs more memory than such peers give"
    return f"waiting for peers: {live} live, {need} needed to hold the model"


class Planned(NamedTuple):
    """A plan found (or None, and why), and what ``compression = "auto"`` prices it with."""

    plan: TrainPlan | None
    placement: PlacementPlan | None
    reason: str
    price: Callable[[CompressionSpec], float] | None = None  # the plan's predicted step (s) under a codec
    slowest_gbps: float = 0.0  # its slowest measured link between placed peers (0: none measured)


def make_train_plan(
    state: SwarmState,
    job: JobSpec,
    now: float,
    epoch: int,
    start_step: int,
    previous: PlacementPlan | None = None,
    cfg: JobPlanConfig | None = None,
    measured_tflops: dict[str, float] | None = None,
    distrusted: frozenset[str] = frozenset(),
    measured_ratios: Mapping[str, float] | None = None,
    positions: Sequence[int] | None = None,
    running: bool = False,
    keep_compression: CompressionSpec | None = None,
) -> tuple[TrainPlan | None, PlacementPlan | None, str]:
    """(plan, the planner's placement, reason). None when the swarm cannot run the job yet.

    ``measured_tflops``: peers' effective speed on this job from earlier steps (``calibrated_tflops``);
    it replaces their start-up probe, which a busy machine or a cold device can get badly wrong, and a
    hostile peer's lie. Unmeasured claims are capped (``claims.believed_tflops``); ``distrusted``: peers
    whose claims proved false, believed no faster than the median until measured. ``measured_ratios``:
    the activation codecs' ratios measured on the job (``codecs.measured_chain_ratios``);
    ``positions``: a bottleneck job's positions fixed by earlier plans (``TrainPlan.bottlenecks``): the
    plan keeps them, and its split may move onto them where that is faster
    (``positions.keep_positions``); None: the plan's own cuts become the positions. ``running``: the job
    has trained under an earlier plan. ``min_peers`` is the threshold to start; a running job re-plans
    on whatever peers it has as long as they hold the model, and says what it waits for when not.

    A job with ``compression = "auto"``: the plan found with the section's defaults is priced under
    each rung of ``autocomp``'s ladder, and the plan is made again with the rung chosen (unless it is
    the settings it was found with), which it
    carries (``TrainPlan.compression``). ``keep_compression``: the running plan's choice, kept."""
    ask = _Ask(now, epoch, start_step, previous, cfg or JobPlanConfig(), measured_tflops or {}, distrusted)
    ask = replace(ask, measured_ratios=measured_ratios, positions=positions, running=running)
    if not job.compression.auto:
        return _plan_job(state, job, ask)[:3]
    if keep_compression is not None:
        chosen, why = keep_compression, "compression auto: as the job's first plan chose"
    else:
        found = _plan_job(state, job, ask)
        if found.plan is None or found.price is None:
            return found[:3]
        chosen, why = pick(job, found.slowest_gbps, found.price)
        if chosen == job.compression.model_copy(update={"auto": False}):  # what the first search used
            stamped = found.plan.model_copy(update={"compression": chosen})
            return stamped, found.placement, f"{found.reason}; {why}"
    run = job.model_copy(update={"compression": chosen})
    train, placement, reason = _plan_job(state, run, ask)[:3]
    if train is None:
        return None, placement, reason
    return train.model_copy(update={"compression": chosen}), placement, f"{reason}; {why}"


@dataclass(frozen=True)
class _Ask:
    """``make_train_plan``'s arguments past the swarm and the job (its docstring says what each is)."""

    now: float
    epoch: int
    start_step: int
    previous: PlacementPlan | None
    cfg: JobPlanConfig
    measured_tflops: dict[str, float]
    distrusted: frozenset[str]
    measured_ratios: Mapping[str, float] | None = None
    positions: Sequence[int] | None = None
    running: bool = False


def _plan_job(state: SwarmState, job: JobSpec, ask: _Ask) -> Planned:
    """``make_train_plan`` with the job's compression as it stands (never "auto")."""
    now, epoch, start_step, previous, cfg = ask.now, ask.epoch, ask.start_step, ask.previous, ask.cfg
    measured_tflops, distrusted, measured_ratios = ask.measured_tflops, ask.distrusted, ask.measured_ratios
    positions, running = ask.positions, ask.running
    sj = step_job(job, measured_ratios)
    usable, spares = usable_peers(state, job)
    if not running and len(usable) < job.min_peers:
        why = f"waiting for peers: {len(usable)} usable of the {job.min_peers} the job needs"
        return Planned(None, None, why)
    if running:
        need = peers_to_hold(sj, [device_of(state.peers[p].record).memory_gb for p in usable])
        if need is None or need > len(usable):
            return Planned(None, None, short_of_memory(len(usable), need))
    claimed = {p: device_of(state.peers[p].record) for p in usable}
    speeds = believed_tflops(
        {p: d.tflops for p, d in claimed.items()},
        measured_tflops or {},
        job.trust.claim_cap,
        distrusted,
        {p: tflops_ceiling(state.peers[p].record.hardware) for p in usable},
    )

    def device(pid: str) -> DeviceSpec:
        return DeviceSpec(speeds[pid], claimed[pid].memory_gb)

    net, net_note = network(state, usable)
    pstate = PlanningState(tuple(usable), tuple(device(p) for p in usable), net)
    lim = job.limits
    replicas, narrowed = lim.replicas, ""
    if running and replicas is not None and replicas * (lim.stages or 1) > len(usable) >= (lim.stages or 1):
        # A forced width is what the job trains with while it can; a running job that lost a replica
        # trains on narrower rather than stalling (the global batch is the same: more micro-batches each).
        replicas = len(usable) // (lim.stages or 1)
        narrowed = f"; {lim.replicas} replicas forced, {replicas} while {len(usable)} live"
    pcfg = PlannerConfig(
        **{
            **cfg.planner.__dict__,
            "seed": job.seed,
            "stages": lim.stages,
            "replicas": replicas,
            "max_stages": lim.max_stages,
            "max_replicas": lim.max_replicas,
        }
    )
    placement, reason = plan(pstate, sj, now, previous, pcfg)  # falls back to a fresh plan itself
    reason += narrowed
    # Peers offering two slots: a one-stage plan that gives them two waves each, where it is faster (or
    # the only plan with the replicas the job asks for); docs/ticktock.md
    waves: dict[str, int] = {}
    two_slot = slot_profiles(state, usable)
    blocked = why_not(job) if two_slot else None
    if two_slot and blocked is None:
        co = colocated_placement(pstate, sj, two_slot, pcfg, placement)
        if co is not None:
            placement, waves, reason = co
    elif blocked is not None:
        reason = f"{reason}; second slots unused: {blocked}"
    if placement is None:
        return Planned(None, None, reason)
    placement = public_leader(placement, {p for p in usable if state.peers[p].record.behind_nat})
    index = {p: i for i, p in enumerate(usable)}
    stages, first = [], 0
    for row, n_layers in zip(placement.stages, placement.layers, strict=True):
        peers = tuple(str(p) for p in row)
        params = sj.model.params_per_layer * n_layers + sj.model.embed_params * (
            (first == 0) + (row is placement.stages[-1])
        )
        params += sj.model.side_params * (first > 0)  # a bottleneck's token table
        nbytes = 2.0 * params * sj.codecs.gradient_wan  # fp16 bytes x the codec's ratio to fp16
        rule = job.trust.aggregation
        # A robust rule needs every contribution unsummed at its shard owner: one-hop trees (an empty list).
        trees = stage_trees(net, index, peers, cfg.max_trees_per_stage, nbytes) if rule == "mean" else []
        stages.append(
            StageAssignment(
                first_layer=first,
                last_layer=first + n_layers,
                peers=list(peers),
                trees=trees,
                aggregation=rule,
                waves=[waves[p] for p in peers] if waves else None,
            )
        )
        first += n_layers
    spares += [Spare(peer_id=str(p), reason="spare: the plan is faster without it") for p in placement.spares]
    train = TrainPlan(
        job=job.name,
        epoch=epoch,
        start_step=start_step,
        stages=stages,
        micro_batches=max(1, placement.micro_batches),
        spares=spares,
        predicted_step_s=float(min(placement.cost, 1e9)),
        link_codecs=plan_link_codecs(placement, index, net, job),
        issued_at=now,
    )
    devices = {p: device(p) for p in usable}
    memory = [min(devices[p].memory_gb for p in st.peers) for st in train.stages]
    speedups = pair_speedups(state, usable)
    fixed = positions if job.model.bottleneck_rank is not None else None

    def predict(p: TrainPlan) -> StepBreakdown:
        return predict_step(p, job, devices, net, usable, speedups, measured_ratios, fixed)

    br = predict(train)
    if fixed is not None and len(train.stages) > 1:  # each cut priced at the width it carries
        train, note = keep_positions(train, fixed, sj, memory, lambda p: predict(p).total)
        reason += note
        br = predict(train)
        train = train.model_copy(update={"predicted_step_s": float(min(br.total, 1e9))})
    train = keep_bottlenecks(job, positions, train)
    ahead = run_ahead_for(br, train.micro_batches, sj, memory)
    if ahead:
        train = train.model_copy(update={"run_ahead": ahead})
        train = train.model_copy(update={"predicted_step_s": float(min(predict(train).total, 1e9))})

    def price(comp: CompressionSpec) -> float:
        """The step (s) this plan would take with ``comp``: its links coded as ``comp`` would code them."""
        run = job.model_copy(update={"compression": comp})
        coded = train.model_copy(update={"link_codecs": plan_link_codecs(placement, index, net, run)})
        return float(predict_step(coded, run, devices, net, usable, speedups, measured_ratios, fixed).total)

    placed = np.ix_(*[[index[p] for p in sorted(train.peers)]] * 2)
    measured = net.measured[placed] & ~np.eye(len(train.peers), dtype=bool)
    slowest = float(directed_bandwidth(net)[placed][measured].min()) if measured.any() else 0.0
    return Planned(train, placement, f"{reason}; {net_note}", price, slowest)


def plan_link_codecs(
    placement: PlacementPlan, index: dict[str, int], net: NetModel, job: JobSpec
) -> LinkCodecs | None:
    """The activation chain of every boundary link of ``placement`` (``codecs.select_link_codecs``)."""
    grid = [[index[str(p)] for p in row] for row in placement.stages]
    return select_link_codecs(grid, net, job.compression)


MAX_RUN_AHEAD = 16  # micro-batches beyond 1F1B's in flight per stage (their activations stay in memory)
RUN_AHEAD_MEMORY = 0.1  # share of a stage's smallest device memory the extra activations may take


def run_ahead_for(
    br: StepBreakdown, micro_batches: int, job: StepJob | None = None, memory_gb: list[float] | None = None
) -> int:
    """Extra micro-batches in flight per stage: 0 when every boundary's round trip (its two transfers and
    the compute on both sides) fits in 1F1B's window; otherwise as many as memory allows. The window the
    model asks for is a floor, not a target: plans are made from the start-up probe (off by 1.5-3x on a
    shared CPU), and measured on the home testbed 2, 8 and 15 ahead gave 1.94, 1.73 and 1.54 s steps
    (docs/benchmarks.md, "Headline"), so on a slow link the plan runs as far ahead as it may."""
    if not br.feasible or len(br.link) == 0:
        return 0
    compute, links = np.array(br.stage_compute), np.array(br.link)
    s = len(compute)
    window = (2.0 * links + compute[:-1] + compute[1:]) / max(float(compute.max()), 1e-9)
    if float((window - (s - np.arange(s - 1))).max()) <= 1e-9:
        return 0
    ahead = min(micro_batches - 1, MAX_RUN_AHEAD)
    if job is not None and memory_gb is not None:
        act = layer_memory(job)[1]  # bytes per layer per micro-batch in flight
        extra = stage_run_ahead(len(br.layers), 1)  # which stages keep the extra micro-batches
        for layers, mem, keeps in zip(br.layers, memory_gb, extra, strict=True):
            if keeps:
                ahead = min(ahead, int(RUN_AHEAD_MEMORY * mem * 1e9 // max(act * max(layers, 1), 1.0)))
    return max(0, ahead)


def predict_step(
    plan: TrainPlan,
    job: JobSpec,
    devices: dict[str, DeviceSpec],
    net: NetModel,
    order: list[str],
    speedups: Mapping[str, float] | None = None,
    measured_ratios: Mapping[str, float] | None = None,
    positions: Collection[int] | None = None,
    messages: Mapping[tuple[str, str], float] | None = None,
) -> StepBreakdown:
    """The step-time model evaluated on a fixed plan (its placement and layer split), for checking the
    model against measured steps. ``order`` names the peers of ``net``'s rows; a peer running two waves
    counts as two slots sharing its device (``speedups``: the pair speedups peers measured);
    ``measured_ratios``: the codec ratios peers measured (``step_job``); ``positions``: a bottleneck
    job's positions (``TrainPlan.bottlenecks``), where a cut is priced at the rank; a cut elsewhere
    carries d_model-wide hidden states and is priced so (None: every cut at the rank). ``messages``:
    one-way seconds a pipeline message took under load per (upstream, downstream) pair, its encode,
    transit and decode (``message_costs``); what of it neither the links' figure nor the wait behind
    the stage's other messages in flight explains is priced as latency (the probe's idle round trip
    misses the codecs and a busy peer's delays)."""
    sj = step_job(job, measured_ratios)
    rows, devices, net, order = unfold(plan, devices, net, order, sj, speedups or {})
    index = {p: i for i, p in enumerate(order)}
    obj = StepObjective(net, [devices[p] for p in order], sj, len(plan.stages), len(rows[0]))
    stats = [obj.group_stat(np.array([index[p] for p in row], dtype=np.int64)) for row in rows]
    pairs = [zip(rows[j], rows[j + 1], strict=True) for j in range(len(rows) - 1)]
    matched = [[(index[a], index[b]) for a, b in pair] for pair in pairs]
    edges = np.array([max(obj.link[a, b] for a, b in pair) for pair in matched])
    if positions is not None and job.model.bottleneck_rank is not None:
        plain = job.model_copy(update={"model": job.model.model_copy(update={"bottleneck_rank": None})})
        wide = link_weight(net, step_job(plain))  # the codec's estimate on full-width states
        for j, pair in enumerate(matched):
            if plan.stages[j + 1].first_layer not in positions:
                edges[j] = max(wide[a, b] for a, b in pair)
    one_way = np.maximum(net.latency_ms, net.latency_ms.T) / 1e3
    latency = np.array([max(one_way[a, b] for a, b in pair) for pair in matched])
    messages = messages or {}
    for j in range(len(rows) - 1):
        seen = [messages[a, b] for a, b in zip(rows[j], rows[j + 1], strict=True) if (a, b) in messages]
        # A measured message also waited behind the others stage j keeps in flight on the same link
        # (a plan that runs ahead fills it on purpose), which the slot's bandwidth term already prices:
        # only what that queue cannot explain is the message's own cost.
        queue = (len(rows) - j - 1 + plan.run_ahead) * max(edges[j] - latency[j], 0.0)  # j is not last
        excess = max(seen, default=0.0) - edges[j] - queue
        if excess > 0:
            latency[j] += excess
            edges[j] += excess
    speed = np.array([s[0] for s in stats])
    memory = np.array([s[1] for s in stats])
    layers = np.array([st.last_layer - st.first_layer for st in plan.stages])
    lat, per_byte = np.stack([s[2] for s in stats]), np.stack([s[3] for s in stats])
    br = step_time(speed, memory, edges, lat, per_byte, sj, len(rows[0]), layers, plan.run_ahead, latency)
    # Every step ends with the commit (peer/train/commit.py): the last peer's READY goes to the leader
    # and its decision comes back before anyone starts the next step: the farthest peer's round trip
    # (up to 0.1 s between the home testbed's peers; next to nothing on a LAN).
    leader = index[plan.leader]
    placed = [index[p] for st in plan.stages for p in st.peers]
    round_trip = net.latency_ms[placed, leader] + net.latency_ms[leader, placed]  # ms, each to the leader
    commit = float(round_trip.max()) / 1e3
    return replace(br, total=br.total + commit, commit=commit) if br.feasible else br


def message_costs(
    plan: TrainPlan, round_trip: Mapping[str, float], hold: Mapping[str, float]
) -> dict[tuple[str, str], float]:
    """One-way seconds of a pipeline message under load per (upstream, downstream) pair of ``plan``:
    half of what the upstream peer measured from sending a micro-batch's activations to having its
    gradient back, less what the downstream peer held them (``StepTiming.round_trip``, ``.hold``)."""
    out = {}
    for up, down in itertools.pairwise(plan.stages):
        for a, b in zip(up.peers, down.peers, strict=False):  # replica i feeds replica i
            if round_trip.get(a, 0.0) > 0 and b in hold:
                out[a, b] = max(0.0, round_trip[a] - hold[b]) / 2.0
    return out


def calibrated_tflops(plan: TrainPlan, job: JobSpec, compute_s: dict[str, float]) -> dict[str, float]:
    """Each peer's effective TFLOP/s on this job: the model's FLOPs of its stage per step divided by the
    compute seconds it measured per step (what a re-plan should use instead of the start-up probe)."""
    sj = step_job(job)
    mb = micro_batches(sj, plan.data_replicas)
    work, head = micro_batch_flops(sj)
    out = {}
    for j, st in enumerate(plan.stages):
        flops = (work * (st.last_layer - st.first_layer) + (head if j == len(plan.stages) - 1 else 0.0)) * mb
        for i, p in enumerate(st.peers):
            if compute_s.get(p, 0.0) > 0:  # a peer running two waves did two shards' work
                out[p] = flops * len(plan.shards(j, i)) / compute_s[p] / 1e12
    return out
