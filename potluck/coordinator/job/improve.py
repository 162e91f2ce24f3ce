"""Whether a running job takes in the peers that joined it. Pure: records in, a verdict out.

A peer that joins a running job is named in the plan at once, as a spare with the reason it is not
placed yet. Placing it costs a re-plan: the placed peers stop at a common step (``handoff``), the peers
whose layers change pull them over the swarm, and everyone restarts. ``evaluate_join`` asks the planner
for two plans (a repair keeps the running shape, so it never adds a replica): the running shape grown
by a pipeline (the newcomers as one more replica of each stage, within the job's limits) and the best
shape found afresh; the faster one that places a newcomer is compared with the running plan, each
step time predicted by the same model with the same speeds and links;
``join_verdict`` goes ahead only when the seconds saved over the job's remaining steps beat the cost of
the move (restart + the slowest state download) by a margin: the repair's hysteresis, amortised over
the steps actually left instead of a fixed horizon.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from potluck.coordinator.job.colocation import pair_speedups
from potluck.coordinator.job.plan import (
    DEFAULT_GBPS,
    JobPlanConfig,
    device_of,
    make_train_plan,
    network,
    predict_step,
    step_job,
)
from potluck.coordinator.placement import PlacementPlan
from potluck.coordinator.placement.costmodel import DeviceSpec
from potluck.coordinator.state import SwarmState
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan


@dataclass(frozen=True)
class ImproveConfig:
    restart_s: float = (
        5.0  # what any re-plan costs the swarm besides moving state: stop, rebuild, first step (s)
    )
    margin: float = 1.5  # the saving must beat the cost by this factor: the step model errs on busy machines
    default_gbps: float = DEFAULT_GBPS  # download rate assumed where no link to a holder was measured
    # placing newcomers must make the step this much faster than the best plan without them (fraction)
    newcomer_gain: float = 0.05


@dataclass(frozen=True)
class JoinOffer:
    """What placing the newcomers would buy and cost."""

    step: int  # the step the swarm stands at
    remaining_steps: int
    current_s: float  # predicted step time of the running plan (s)
    new_s: float  # predicted step time of the best plan that may use the newcomers (s)
    move_s: float  # slowest state download of a peer whose layers change (s; they download at once)
    placed: tuple[str, ...]  # newcomers the best plan places
    full: str = ""  # when it places none: why (the job's limits, or the plan is faster without them)


@dataclass(frozen=True)
class JoinEvaluation:
    offer: JoinOffer
    plan: TrainPlan | None  # the best plan with the newcomers (its epoch and start step are provisional)
    placement: PlacementPlan | None


def layer_state_bytes(job: JobSpec, first: int, last: int) -> float:
    """Bytes of layers [first, last) with their optimizer state (the planner's bytes per parameter),
    the embedding with the first layer, the LM head with the last, a token table after a cut."""
    sj = step_job(job)
    m = sj.model
    params = m.params_per_layer * (last - first)
    params += m.embed_params * ((first == 0) + (last == job.model.n_layers))
    params += m.side_params * (first > 0)  # a bottleneck's token table (model.bottleneck_tokens)
    return params * sj.bytes_per_param


def download_gbps(state: SwarmState, peer: str, holders: Collection[str], default: float) -> float:
    """The best measured link between ``peer`` and any holder, either direction (Gbit/s)."""
    rates = [
        s.bandwidth_gbps
        for src, rep in state.links.items()
        for s in rep.links
        if s.bandwidth_gbps > 0 and {src, s.dst} <= ({peer} | set(holders)) and peer in (src, s.dst)
    ]
    return max(rates, default=default)


def move_seconds(
    current: TrainPlan, new: TrainPlan, job: JobSpec, state: SwarmState, default: float
) -> float:
    """Seconds until every peer whose layers change under ``new`` holds them: downloads run at once,
    each from the running plan's peers at its best measured link."""
    held = {p: (st.first_layer, st.last_layer) for st in current.stages for p in st.peers}
    holders = set(held)
    worst = 0.0
    for st in new.stages:
        for p in st.peers:
            if held.get(p) != (st.first_layer, st.last_layer):
                nbytes = layer_state_bytes(job, st.first_layer, st.last_layer)
                worst = max(worst, nbytes * 8.0 / (download_gbps(state, p, holders, default) * 1e9))
    return worst


def newcomer_speeds(
    state: SwarmState, calibrated: Mapping[str, float], newcomers: Collection[str], cap: float = 0.0
) -> dict[str, float]:
    """``calibrated`` plus a speed for each newcomer: the median measured speed of placed peers with the
    same device (a short start-up probe on a busy machine is far noisier than whole training steps),
    else its probe scaled by the swarm's median ratio of measured to probed speed (a probe is a bare
    matmul, a step is not, so unscaled it would look fastest). ``cap`` > 0: no newcomer counts for more
    than ``cap`` x the median measured speed until its own steps are measured (its claim may be a lie)."""
    ratios = []
    by_device: dict[str, list[float]] = {}
    for p, speed in calibrated.items():
        if p not in state.peers or speed <= 0:
            continue
        hw = state.peers[p].record.hardware
        by_device.setdefault(hw.label, []).append(speed)
        if (probe := device_of(state.peers[p].record).tflops) > 0:
            ratios.append(speed / probe)
    scale = statistics.median(ratios) if ratios else 1.0
    out = dict(calibrated)
    for p in newcomers:
        if p in state.peers:
            hw = state.peers[p].record.hardware
            same = by_device.get(hw.label)
            out[p] = statistics.median(same) if same else device_of(state.peers[p].record).tflops * scale
            if cap > 0 and calibrated:
                out[p] = min(out[p], cap * statistics.median(calibrated.values()))
    return out


def predicted_step_s(
    plan: TrainPlan,
    job: JobSpec,
    state: SwarmState,
    speeds: Mapping[str, float],
    measured_ratios: Mapping[str, float] | None = None,
    positions: Sequence[int] | None = None,
) -> float:
    """The step-time model on ``plan`` as it stands, with ``speeds`` (TFLOP/s) over probes and the
    links priced at ``measured_ratios`` where peers measured them, a bottleneck job's cuts at the
    width they carry given its ``positions`` (seconds)."""
    order = sorted({p for st in plan.stages for p in st.peers})
    devices = {}
    for p in order:
        dev = device_of(state.peers[p].record)
        devices[p] = DeviceSpec(speeds[p], dev.memory_gb) if speeds.get(p, 0.0) > 0 else dev
    net, _ = network(state, order)
    speedups = pair_speedups(state, order)
    return float(predict_step(plan, job, devices, net, order, speedups, measured_ratios, positions).total)


def full_reason(job: JobSpec, plan: TrainPlan) -> str:
    """Why a plan that leaves a newcomer out does so: the job's limits, or speed."""
    lim, s, r = job.limits, len(plan.stages), plan.n_replicas
    if lim.stages is not None and lim.replicas is not None:
        return f"the plan is full: the job's limits force {lim.stages} x {lim.replicas}"
    if r >= lim.max_replicas and (lim.stages == s or s >= min(lim.max_stages, job.model.n_layers)):
        return f"the plan is full: limits.max_replicas={lim.max_replicas}, {s} stage(s)"
    return "the best plan found is faster without it"


def grown(job: JobSpec, plan: TrainPlan, newcomers: int) -> JobSpec | None:
    """``job`` with its shape forced to the running plan's plus one pipeline, or None when the job's
    limits or the number of newcomers do not allow one."""
    lim, s, r = job.limits, len(plan.stages), plan.n_replicas
    if newcomers < s or lim.replicas is not None or r + 1 > lim.max_replicas:
        return None
    if lim.stages is not None and lim.stages != s:
        return None
    return job.model_copy(update={"limits": lim.model_copy(update={"stages": s, "replicas": r + 1})})


def evaluate_join(
    state: SwarmState,
    job: JobSpec,
    plan: TrainPlan,
    step: int,
    speeds: Mapping[str, float],
    newcomers: Collection[str],
    now: float,
    cfg: ImproveConfig | None = None,
    plan_cfg: JobPlanConfig | None = None,
    measured_s: float = 0.0,
    measured_ratios: Mapping[str, float] | None = None,
) -> JoinEvaluation:
    """Plan with everyone usable in ``state`` (two searches: seconds of CPU) and price the move.
    ``speeds``: the placed peers' measured TFLOP/s (``calibrated_tflops``); ``step``: where the swarm
    stands; ``measured_s``: its measured step time (s; 0: unknown). The model counts compute and
    transfers but not the waits of a real step, so with a measured step both predictions are scaled to
    it: the model's ratio applied to the step the swarm actually takes. ``measured_ratios``: the
    activation codecs' ratios the peers measured on the job; the plans and both predictions price
    the links at them, as the re-plan itself will."""
    cfg = cfg or ImproveConfig()
    speeds = newcomer_speeds(state, speeds, newcomers, job.trust.claim_cap)
    ratios, fixed = measured_ratios, plan.bottleneck_cuts  # the running plan's bottleneck positions
    run = plan.under(job)  # priced with the compression the plans run with ("auto": the chosen)
    current_s = predicted_step_s(plan, run, state, speeds, ratios, fixed)
    remaining = max(0, job.steps - step)
    best: tuple[float, TrainPlan, PlacementPlan] | None = None
    fresh: TrainPlan | None = None

    def search(swarm: SwarmState, shaped: JobSpec) -> tuple[TrainPlan | None, PlacementPlan | None]:
        found, placement, _ = make_train_plan(
            swarm,
            shaped,
            now,
            plan.epoch + 1,
            step,
            None,
            plan_cfg,
            dict(speeds),
            measured_ratios=ratios,
            positions=fixed,
            keep_compression=plan.compression,
        )
        return found, placement

    for shaped in (grown(job, plan, len(newcomers)), job):
        if shaped is None:
            continue
        cand, placement = search(state, shaped)
        if cand is None or placement is None:
            continue
        fresh = cand if shaped is job else fresh
        cost = predicted_step_s(cand, run, state, speeds, ratios, fixed)
        places = any(cand.position(p) is not None for p in newcomers)
        if places and (best is None or cost < best[0]):
            best = (cost, cand, placement)
    if best is None:
        why = full_reason(job, fresh or plan)
        if fresh is not None and not why.startswith("the plan is full"):
            fresh_s = predicted_step_s(fresh, run, state, speeds, ratios, fixed)
            why = f"{why} ({fresh_s:.3f} s vs now {current_s:.3f} s)"
        return JoinEvaluation(JoinOffer(step, remaining, current_s, current_s, 0.0, (), why), None, None)
    new_s, cand, placement = best
    # The same search without the newcomers: a gain it finds too comes from re-placing the peers already
    # here (speeds measured on a busy machine move from plan to plan), not from the newcomers, and would
    # cost a re-plan for nothing (churn run A, 12-07: 4 of 9 joiners were "placed" by swapping them for
    # an equal spare, each swap a hand-off of the whole swarm).
    alone, _ = search(state.without(newcomers), job)
    if alone is not None:
        alone_s = predicted_step_s(alone, run, state, speeds, ratios, fixed)
        if new_s >= alone_s * (1.0 - cfg.newcomer_gain):
            why = f"a plan without it is as fast ({alone_s:.3f} s vs {new_s:.3f} s with it)"
            return JoinEvaluation(JoinOffer(step, remaining, current_s, current_s, 0.0, (), why), None, None)
    if measured_s > 0 and current_s > 0:
        current_s, new_s = measured_s, new_s * measured_s / current_s
    placed = tuple(sorted(p for p in newcomers if cand.position(p) is not None))
    move_s = move_seconds(plan, cand, job, state, cfg.default_gbps)
    return JoinEvaluation(JoinOffer(step, remaining, current_s, new_s, move_s, placed), cand, placement)


def join_verdict(offer: JoinOffer, cfg: ImproveConfig | None = None) -> tuple[str, str]:
    """("improve", why) to re-plan with the newcomers now, or ("keep", the reason a spare is told)."""
    cfg = cfg or ImproveConfig()
    if not offer.placed:
        return "keep", f"not placed: {offer.full}"
    gain = (offer.current_s - offer.new_s) * offer.remaining_steps
    cost = cfg.restart_s + offer.move_s
    numbers = (
        f"predicted step {offer.current_s:.3f} -> {offer.new_s:.3f} s, "
        f"saves {max(gain, 0.0):.1f} s in {offer.remaining_steps} steps, move cost {cost:.1f} s"
    )
    if gain > cfg.margin * cost:
        return "improve", f"placing {len(offer.placed)} newcomer(s): {numbers}"
    return "keep", f"placed at a re-plan if it pays: {numbers}"
