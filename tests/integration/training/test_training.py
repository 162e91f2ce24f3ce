"""Swarm training on loopback equals the single-process reference; compressed stays close; resume
continues the loss curve; failures abort the step everywhere."""

import asyncio

import pytest
import torch

from potluck.model.reference import parameters_by_global_name, reference_run
from potluck.testbed.harness.training import tiny_dataset, tiny_job, train_swarm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SPLITS = [(0, 2), (2, 4)]


def test_uncompressed_2x2_equals_single_process_reference(tmp_path):
    job = tiny_job()
    reports, trainers = asyncio.run(train_swarm(job, 2, 2, SPLITS, tmp_path))
    swarm_losses = [r.loss for r in reports[(1, 0)]]
    assert len(swarm_losses) == job.steps
    for key, rep in reports.items():  # every peer learned the same loss from the commit
        assert [r.loss for r in rep] == swarm_losses, key
    ref_losses, ref = reference_run(job, tiny_dataset(job), n_replicas=2)
    assert swarm_losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    assert swarm_losses[-1] < swarm_losses[0] - 0.5  # it learns
    want = parameters_by_global_name(ref)
    for (stage, replica), tr in trainers.items():
        for name, tensor in parameters_by_global_name(tr.runner).items():
            torch.testing.assert_close(
                tensor, want[name], rtol=1e-3, atol=2e-5, msg=f"{stage}/{replica} {name}"
            )


def test_compressed_default_codecs_stay_within_2_percent(tmp_path):
    plain = tiny_job()
    packed = tiny_job(
        compression={"activations": "int8:block=64", "gradients": "int8:block=64", "error_feedback": True}
    )
    base, _ = asyncio.run(train_swarm(plain, 2, 2, SPLITS, tmp_path / "a"))
    comp, _ = asyncio.run(train_swarm(packed, 2, 2, SPLITS, tmp_path / "b"))
    last_plain, last_comp = base[(1, 0)][-1].loss, comp[(1, 0)][-1].loss
    assert abs(last_comp - last_plain) / last_plain < 0.02, (last_plain, last_comp)
    assert comp[(0, 0)][-1].bytes_sent < 0.5 * base[(0, 0)][-1].bytes_sent  # int8 vs fp32 on the wire


def test_resume_continues_the_loss_curve_even_with_new_stage_boundaries(tmp_path):
    job = tiny_job(checkpoint={"interval": 5})
    full, _ = asyncio.run(train_swarm(job, 2, 2, SPLITS, tmp_path / "full"))
    root = tmp_path / "resumed"
    first, _ = asyncio.run(train_swarm(job, 2, 2, SPLITS, root, stop_after=10))
    assert len(first[(1, 0)]) == 10 and first[(0, 0)][-1].checkpoint is not None
    # Relaunch from the step-10 checkpoint with a different cut: 3 layers, then 1.
    rest, _ = asyncio.run(train_swarm(job, 2, 2, [(0, 3), (3, 4)], root, start_step=10, epoch=2))
    want = [r.loss for r in full[(1, 0)][10:]]
    got = [r.loss for r in rest[(1, 0)]]
    assert [r.step for r in rest[(1, 0)]] == list(range(10, 20))
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


async def _four_peers(
    tmp_path, job, victim, die_after=None, on_plan=lambda plan: None, step_s=4.0, watch=False
):
    """A 2 x 2 swarm of real daemons on loopback, each peer keyed; trainer ``victim`` stops at once
    (its daemon shut down) when it raises ``SystemExit``, or right after committing step ``die_after``.
    Returns each trainer's end ("died", "finished" or its ``StepAborted``) and the trainers."""
    from potluck.net.config import TransportConfig
    from potluck.net.mailbox import Mailbox
    from potluck.peer.config import TrainerConfig
    from potluck.peer.errors import StepAborted
    from potluck.peer.train.trainer import Trainer
    from potluck.testbed.harness.p2p import keyed_group
    from potluck.testbed.harness.training import PROTOCOL, make_plan

    dataset = tiny_dataset(job)
    async with keyed_group(4, tmp_path) as keyed:
        keys = {n.peer_id.to_base58(): identity for n, identity in keyed}  # they seal their pipelines

        async def nowhere(peer):  # no announced addresses: a liveness check tries the known route alone
            return []

        book = nowhere if watch else None  # ``watch``: a peer whose stream ends is checked at once
        boxes = [Mailbox(n, PROTOCOL, TransportConfig(timeout_s=5), addresses=book) for n, _ in keyed]
        for b in boxes:
            await b.start()
        ids = [b.peer_id for b in boxes]
        plan = make_plan(job, [ids[:2], ids[2:]], SPLITS)
        on_plan(plan)
        cfg = TrainerConfig(step_timeout_s=step_s, allreduce_timeout_s=step_s - 1.0, timeout_floor_s=step_s)
        trainers = [Trainer(b, job, plan, dataset, cfg, tmp_path, identity=keys[b.peer_id]) for b in boxes]

        def maybe_die(report):
            if report.step == die_after:
                raise SystemExit  # this peer stops right after committing the step

        async def run(i, tr):
            try:
                await tr.run(maybe_die if i == victim else None)
            except SystemExit:
                await keyed[i][0].shutdown()
                return "died"
            except StepAborted as e:
                return e
            return "finished"

        return await asyncio.gather(*(run(i, t) for i, t in enumerate(trainers))), trainers


def test_a_peer_dying_mid_step_aborts_the_step_on_every_survivor(tmp_path):
    from potluck.peer.errors import StepAborted

    results, trainers = asyncio.run(_four_peers(tmp_path, tiny_job(), victim=3, die_after=4))
    assert results[3] == "died"  # stage 1, replica 1
    assert all(isinstance(r, StepAborted) for r in results[:3]), results
    # Step 5 was applied by nobody: every survivor stands at step 5 with identical stage weights.
    assert [t.step for t in trainers[:3]] == [5, 5, 5]
    for a, b in zip(trainers[0].runner.params, trainers[1].runner.params, strict=True):
        assert torch.equal(a, b)


def test_the_leader_stops_the_survivors_waits_on_a_step_it_knows_will_not_commit(tmp_path):
    """Churn run E: the leader's pipeline partner died; the leader saw it at once and gave the step up,
    and its own stage's other replica, waiting for the leader's gradients in the stage's all-reduce,
    waited out its bound before the swarm could re-plan. The leader now says at once that the step will
    not commit (STEP_ABORT): every survivor stops long before the 60 s bound of its waits."""
    from potluck.peer.errors import StepAborted

    async def bounded():
        return await asyncio.wait_for(_four_peers(tmp_path, tiny_job(), 2, 4, step_s=60.0, watch=True), 30.0)

    results, trainers = asyncio.run(bounded())
    assert results[2] == "died"  # stage 1, replica 0: the leader's pipeline partner
    assert all(isinstance(r, StepAborted) for r in (results[0], results[1], results[3])), results
    assert [t.step for t in (trainers[0], trainers[1], trainers[3])] == [5, 5, 5]


def test_a_leader_dying_inside_its_commit_still_has_the_step_applied_by_every_survivor(tmp_path, monkeypatch):
    """Churn run C (issue 38): the leader died after its COMMIT reached stage 1 but not its own stage's
    other replica, and the stages stood one step apart. The replica that missed the decision asks the
    others for it (the leader's signature makes a relayed one trustworthy) and applies the step too."""
    import potluck.peer.train.commit as commit
    from potluck.net.tags import INDEX_BITS, Round, Stream
    from potluck.peer.errors import StepAborted

    job = tiny_job()
    sent = commit.announce

    async def leader_dies_halfway(box, peers, tag, payload, what, level=None):
        decision = tag.stream >> INDEX_BITS == Stream.COMMIT_DECISION
        if decision and Round.unpack(tag.round).step == 4:
            await sent(box, [p for p in peers if p != missed[0]], tag, payload, what)
            raise SystemExit  # dies before its own replica heard the decision
        return await sent(box, peers, tag, payload, what)

    missed = []  # stage 0, replica 1: the peer the leader never tells
    monkeypatch.setattr(commit, "announce", leader_dies_halfway)
    on_plan = lambda plan: missed.append(plan.stages[0].peers[1])  # noqa: E731
    results, trainers = asyncio.run(_four_peers(tmp_path, job, victim=0, on_plan=on_plan))
    assert results[0] == "died"
    assert all(isinstance(r, StepAborted) for r in results[1:]), results
    # Everyone alive applied step 4 (the one the leader died committing), nobody step 5.
    assert [t.step for t in trainers[1:]] == [5, 5, 5]
    _, ref = reference_run(job, tiny_dataset(job), n_replicas=2, steps=5)
    want = parameters_by_global_name(ref)
    for name, tensor in parameters_by_global_name(trainers[1].runner).items():
        torch.testing.assert_close(tensor, want[name], rtol=1e-3, atol=2e-5, msg=name)
    for a, b in zip(trainers[2].runner.params, trainers[3].runner.params, strict=True):
        assert torch.equal(a, b)


def test_bucketed_allreduce_overlaps_the_backward_and_keeps_the_result(tmp_path):
    from potluck.peer.config import TrainerConfig

    job = tiny_job(steps=4)
    cfg = TrainerConfig(step_timeout_s=60, bucket_elements=3000)
    reports, trainers = asyncio.run(train_swarm(job, 2, 2, SPLITS, tmp_path, cfg=cfg))
    for tr in trainers.values():
        assert tr.sync is not None and len(tr.sync.buckets) >= 4
        assert tr.sync.launched_early == len(tr.sync.buckets)  # every bucket left during the backward
    ref_losses, _ = reference_run(job, tiny_dataset(job), n_replicas=2)
    assert [r.loss for r in reports[(1, 0)]] == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    a, b = trainers[(0, 0)].runner.params, trainers[(0, 1)].runner.params
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # replicas stay bit-identical


def test_diloco_local_steps_resync_replicas_every_h_steps(tmp_path):
    job = tiny_job(steps=6, compression={"sync_every": 3, "gradients": "int8:block=64"})
    reports, trainers = asyncio.run(train_swarm(job, 2, 2, SPLITS, tmp_path))
    losses = [r.loss for r in reports[(1, 0)]]
    assert len(losses) == 6 and losses[-1] < losses[0]
    for stage in (0, 1):  # after the outer sync at step 6 both replicas hold the same weights
        a, b = trainers[(stage, 0)].runner.params, trainers[(stage, 1)].runner.params
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        assert trainers[(stage, 0)].diloco is not None and trainers[(stage, 0)].diloco.syncs == 2


def test_coded_outer_sync_keeps_replicas_identical_on_a_fraction_of_the_bytes(tmp_path):
    """compression.outer (issue 22): 1 stage x 2 replicas, H = 4; the replicas all-gather 2-bit coded
    pseudo-gradients instead of all-reducing them dense in fp32."""
    dense = tiny_job(steps=8, compression={"sync_every": 4})
    coded = tiny_job(steps=8, compression={"sync_every": 4, "outer": "int2:block=512|zstd"})
    base, _ = asyncio.run(train_swarm(dense, 1, 2, [(0, 4)], tmp_path / "dense"))
    reports, trainers = asyncio.run(train_swarm(coded, 1, 2, [(0, 4)], tmp_path / "coded"))
    losses = [r.loss for r in reports[(0, 0)]]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.3  # it learns
    a, b = trainers[(0, 0)], trainers[(0, 1)]
    assert a.diloco is not None and a.diloco.syncs == 2 and a.diloco.outer_codec is not None
    assert all(torch.equal(x, y) for x, y in zip(a.runner.params, b.runner.params, strict=True))
    # a single stage sends only its commit votes and the outer syncs (steps 3 and 7): a sync step's bytes
    # less the step before's are the sync's
    sync_coded = sum(reports[(0, 0)][s].bytes_sent - reports[(0, 0)][s - 1].bytes_sent for s in (3, 7))
    sync_dense = sum(base[(0, 0)][s].bytes_sent - base[(0, 0)][s - 1].bytes_sent for s in (3, 7))
    assert sync_coded < sync_dense / 8, (sync_coded, sync_dense)
    assert abs(losses[-1] - base[(0, 0)][-1].loss) / base[(0, 0)][-1].loss < 0.05


def test_coded_outer_sync_resumes_from_a_checkpoint_with_an_empty_residual(tmp_path):
    job = tiny_job(
        steps=8, checkpoint={"interval": 4}, compression={"sync_every": 4, "outer": "int2:block=512|zstd"}
    )
    # each replica on its own disk: their inner AdamW moments differ, so their checkpoints do too
    first, _ = asyncio.run(train_swarm(job, 1, 2, [(0, 4)], tmp_path, stop_after=4, own_disks=True))
    assert first[(0, 0)][-1].checkpoint is not None  # taken right after the step-4 sync
    rest, trainers = asyncio.run(
        train_swarm(job, 1, 2, [(0, 4)], tmp_path, start_step=4, epoch=2, own_disks=True)
    )
    assert [r.step for r in rest[(0, 0)]] == list(range(4, 8))
    a, b = trainers[(0, 0)], trainers[(0, 1)]
    assert a.diloco is not None and a.diloco.outer_codec is not None and a.diloco.syncs == 1
    assert all(torch.equal(x, y) for x, y in zip(a.runner.params, b.runner.params, strict=True))
    assert rest[(0, 0)][-1].loss < first[(0, 0)][0].loss - 0.3


def test_between_diloco_syncs_a_peer_serves_the_last_synced_state(tmp_path):
    """A kill between two syncs must leave the survivors something to resume from (issue 38): each
    replica serves the weights of the last sync, which all replicas agree on, labelled with that step."""
    job = tiny_job(steps=12, compression={"sync_every": 4})
    _, synced = asyncio.run(train_swarm(job, 1, 2, [(0, 4)], tmp_path / "a", stop_after=4))
    later, trainers = asyncio.run(train_swarm(job, 1, 2, [(0, 4)], tmp_path / "b", stop_after=6))
    assert [r.step for r in later[(0, 0)]] == list(range(6))
    a, b = trainers[(0, 0)], trainers[(0, 1)]
    assert a.step == 6 and a.held_step == 4
    sa, sb = a.snapshot(), b.snapshot()
    assert sa is not None and sb is not None and sa.meta.step == sb.meta.step == 4
    weights = [k for k in sa.tensors if k.startswith("model.")]
    assert weights and all(torch.equal(sa.tensors[k], sb.tensors[k]) for k in weights)  # the replicas agree
    # ... on the weights a run stopped at the sync holds, not on their drifted ones of step 6
    reference = synced[(0, 0)].runner.state_tensors()
    assert all(torch.allclose(sa.tensors[k], reference[k], rtol=0, atol=1e-6) for k in weights)
    drifted = a.runner.state_tensors()
    assert any(not torch.equal(sa.tensors[k], drifted[k]) for k in weights)
    steps = {k: v for k, v in sa.tensors.items() if k.endswith(".step")}
    assert steps and all(int(v.max()) == 4 for v in steps.values())  # AdamW's counts as at step 4
    # A step or an outer sync that failed half-way leaves the inner state torn, not the last sync's
    # weights: still served (churn run Z2)
    a._consistent = False
    torn = a.snapshot()
    assert torn is not None and torn.meta.step == 4
    assert all(torch.equal(torn.tensors[k], sa.tensors[k]) for k in weights)
    # A run that ends also serves the sync before its last (a stage whose sync a death interrupted holds
    # only that one): after syncs at 4 and 8, the state of step 4 is the one a run stopped at 4 holds
    _, runs = asyncio.run(train_swarm(job, 1, 2, [(0, 4)], tmp_path / "c", stop_after=10))
    older, newest = runs[(0, 0)].snapshots()
    assert (older.meta.step, newest.meta.step) == (4, 8)
    assert all(torch.allclose(older.tensors[k], reference[k], rtol=0, atol=1e-6) for k in weights)


@pytest.mark.parametrize(
    ("comp", "landed"),
    [
        ({"outer_overlap": False}, 4),  # waited for: written at once
        ({}, 5),  # overlapped, with momentum: lands under one step
        ({"outer_lr": 1.0, "outer_momentum": 0.0}, 7),  # averaging: lands after H - 1 = 3 steps
        ({"outer_lr": 1.0, "outer_momentum": 0.0, "outer_delay": 2}, 6),
    ],
)
def test_diloco_syncs_at_the_job_end_and_checkpoints_at_the_first_sync_past_each_interval(
    tmp_path, comp, landed
):
    """steps = 8, H = 4: a sync at step 4 and a last one at step 8, so the final model is the replicas'
    agreed one; checkpoints every 3 steps fall on those syncs (4 passed 3, 8 is the end)."""
    job = tiny_job(steps=8, checkpoint={"interval": 3}, compression={"sync_every": 4, **comp})
    reports, trainers = asyncio.run(train_swarm(job, 1, 2, [(0, 4)], tmp_path, own_disks=True))
    a, b = trainers[(0, 0)], trainers[(0, 1)]
    assert a.diloco is not None and a.diloco.syncs == 2 and a.held_step == 8
    assert all(torch.equal(x, y) for x, y in zip(a.runner.params, b.runner.params, strict=True))
    # An overlapped sync due after step 4 lands under the steps after it (compression.outer_delay): its
    # state is written then, as the state after 4 steps. The job's last sync is waited for and written
    # at once.
    written = [(r.step + 1, r.checkpoint.name) for r in reports[(0, 0)] if r.checkpoint is not None]
    assert written == [(landed, "step-00000004"), (8, "step-00000008")]
