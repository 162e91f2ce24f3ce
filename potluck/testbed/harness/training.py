"""In-process training swarms: real p2pd daemons on loopback, one Trainer per peer, one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

from hivemind.p2p import P2P
from hivemind.utils import get_dht_time

from potluck.model.data import ByteTokenizer, TokenDataset, generated_corpus
from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.peer.config import TrainerConfig
from potluck.peer.train.trainer import StepReport, Trainer
from potluck.protocol.jobspec import AggregationRule, JobSpec
from potluck.protocol.training import LinkCodecs, Progress, StageAssignment, TrainPlan
from potluck.testbed.harness.hostile import Forge, HostileMailbox
from potluck.testbed.harness.p2p import keyed_group

PROTOCOL = "potluck/test/train/1"


def tiny_job(**overrides: object) -> JobSpec:
    data: dict[str, object] = {
        "name": "tiny-test",
        "seed": 3,
        "steps": 20,
        "model": {"n_layers": 4, "d_model": 32, "n_heads": 2, "vocab_size": 256, "seq_len": 16},
        "batch": {"tokens_per_step": 16 * 8, "micro_batch_size": 2},
        "optimizer": {"lr": 3e-3, "warmup_steps": 3},
        "compression": {"activations": "none", "gradients": "none", "error_feedback": False},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}  # type: ignore[dict-item]
        else:
            data[key] = value
    return JobSpec.model_validate(data)


def tiny_dataset(job: JobSpec) -> TokenDataset:
    return TokenDataset(ByteTokenizer().encode(generated_corpus(40_000, job.seed)), job.model.seq_len)


def make_plan(
    job: JobSpec,
    grid: list[list[str]],
    splits: list[tuple[int, int]],
    epoch: int = 1,
    start_step: int = 0,
    aggregation: AggregationRule = "mean",
    waves: list[int] | None = None,
    link_codecs: LinkCodecs | None = None,
    bottlenecks: list[int] | None = None,
) -> TrainPlan:
    """grid[j][i]: the peer of stage j, replica i; ``waves``: per replica of a one-stage plan;
    ``link_codecs``: per-link activation chains; ``bottlenecks``: a bottleneck job's positions."""
    stages = [
        StageAssignment(first_layer=a, last_layer=b, peers=row, aggregation=aggregation, waves=waves)
        for (a, b), row in zip(splits, grid, strict=True)
    ]
    return TrainPlan(
        job=job.name,
        epoch=epoch,
        start_step=start_step,
        stages=stages,
        micro_batches=2,
        link_codecs=link_codecs,
        bottlenecks=bottlenecks,
        issued_at=get_dht_time(),
    )


async def train_swarm(
    job: JobSpec,
    n_stages: int,
    n_replicas: int,
    splits: list[tuple[int, int]],
    checkpoint_root: Path,
    start_step: int = 0,
    stop_after: int | None = None,
    epoch: int = 1,
    cfg: TrainerConfig | None = None,
    aggregation: AggregationRule = "mean",
    hostile: Mapping[int, Forge] | None = None,
    make_box: Callable[[int, P2P], Mailbox] | None = None,
    on_step: Callable[[tuple[int, int], StepReport, dict[tuple[int, int], Trainer]], None] | None = None,
    setup: Callable[[dict[tuple[int, int], Trainer]], None] | None = None,
    waves: list[int] | None = None,
    link_codecs: LinkCodecs | None = None,
    own_disks: bool = False,
    bottlenecks: list[int] | None = None,
) -> tuple[dict[tuple[int, int], list[StepReport]], dict[tuple[int, int], Trainer]]:
    """Train on n_stages x n_replicas in-process peers; returns per-(stage, replica) reports and trainers.

    ``hostile``: replica index -> how that replica (of every stage) rewrites the gradients it sends;
    ``make_box(replica, node)``: the mailbox of each peer instead (any attack); ``on_step``: called
    with (stage, replica), the report and every trainer after each committed step; ``setup``: called
    with every trainer before training starts (to make some of them hostile); ``waves``: per replica
    of a one-stage plan, how many data shards it trains as tick-tock waves (1 or 2)."""
    dataset = tiny_dataset(job)
    hostile = hostile or {}
    tcfg = TransportConfig(timeout_s=30)

    def box_for(k: int, node: P2P) -> Mailbox:
        if make_box is not None:
            return make_box(k % n_replicas, node)
        if k % n_replicas in hostile:
            return HostileMailbox(node, PROTOCOL, tcfg, fn=hostile[k % n_replicas])
        return Mailbox(node, PROTOCOL, tcfg)

    keys = checkpoint_root / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    async with keyed_group(n_stages * n_replicas, keys) as keyed:
        nodes = [p2p for p2p, _ in keyed]
        identities = {p2p.peer_id.to_base58(): identity for p2p, identity in keyed}
        boxes = [box_for(k, node) for k, node in enumerate(nodes)]
        for box in boxes:
            box.identity = identities[box.peer_id]  # type: ignore[attr-defined]  # hostile ones seal with it
            await box.start()
        ids = [b.peer_id for b in boxes]
        grid = [[ids[j * n_replicas + i] for i in range(n_replicas)] for j in range(n_stages)]
        plan = make_plan(job, grid, splits, epoch, start_step, aggregation, waves, link_codecs, bottlenecks)
        trainers = {}
        reports: dict[tuple[int, int], list[StepReport]] = {}
        for k, box in enumerate(boxes):
            trainer_cfg = cfg or TrainerConfig(step_timeout_s=60)
            # ``own_disks``: peer k writes under <root>/disk-k, as separate machines do (replicas whose
            # states differ, DiLoCo's inner AdamW moments, must not write one shared file)
            root = checkpoint_root / f"disk-{k}" if own_disks else checkpoint_root
            tr = Trainer(box, job, plan, dataset, trainer_cfg, root, identity=identities[box.peer_id])
            trainers[(tr.stage, tr.replica)] = tr
            reports[(tr.stage, tr.replica)] = []

        def record(key: tuple[int, int]) -> Callable[[StepReport], None]:
            def on_report(r: StepReport) -> None:
                reports[key].append(r)
                if on_step is not None:
                    on_step(key, r, trainers)

            return on_report

        if setup is not None:
            setup(trainers)
        await asyncio.gather(*(tr.run(record(k), until=stop_after) for k, tr in trainers.items()))
        for box in boxes:
            await box.close()
    return reports, trainers


def witness_records(trainers: Mapping[tuple[int, int], Trainer]) -> list[Progress]:
    """Each trainer's audit of its fellow replicas as the progress record its worker would sign."""
    out = []
    for (stage, replica), tr in trainers.items():
        out.append(
            Progress(
                peer_id=tr.box.peer_id,
                job=tr.plan.job,
                epoch=tr.plan.epoch,
                stage=stage,
                replica=replica,
                step=tr.step,
                witnessed=tr.audit.witnesses(tr.box.peer_id),
                issued_at=0.0,
            )
        )
    return out
