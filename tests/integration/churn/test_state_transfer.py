"""Live state transfer between real p2pd daemons: byte-identical weights and AdamW state from several
holders at once, completion when a holder dies mid-transfer, and corrupted chunks caught by their hash."""

import asyncio
import dataclasses
import logging
import threading
import time

import pytest
import torch

from potluck.model.checkpoint import save_stage
from potluck.model.stage import StageRunner
from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.net.streams import Streams
from potluck.peer.config import TrainerConfig
from potluck.peer.state.source import DiskSource, Holder, PeerSource, fetch_first
from potluck.peer.train.trainer import StepReport, Trainer
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec
from potluck.testbed.harness.p2p import keyed_group
from potluck.testbed.harness.training import PROTOCOL, make_plan, tiny_dataset, tiny_job, train_swarm
from potluck.transfer.errors import StateError
from potluck.transfer.manifest import StateWant
from potluck.transfer.server import Served, StateServer, TransferConfig
from potluck.transfer.snapshot import StageState, rename, select

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SWARM = "xfer-test"
MODEL = ModelSpec(n_layers=4, d_model=128, n_heads=2, vocab_size=256, seq_len=16)
CFG = TransferConfig(
    chunk_bytes=64 << 10, timeout_s=5.0, deadline_s=60.0, batch_chunks=4, settle_s=0.0
)  # faults at once


def trained_stage(first: int, last: int, step: int = 3) -> StageState:
    """A stage after ``step`` AdamW steps on fixed pseudo-gradients (identical on every call)."""
    runner = StageRunner(MODEL, first, last, seed=5, optimizer_spec=OptimizerSpec())
    gen = torch.Generator().manual_seed(first * 100 + last)
    for _ in range(step):
        for p in runner.params:
            p.grad = torch.randn(p.shape, generator=gen)
        runner.step(lr=1e-3)
    meta = StageMeta(
        job="xfer", step=step, stage=0 if first == 0 else 1, n_stages=2, first_layer=first,
        last_layer=last, model=MODEL, seed=5, tokenizer=None, epoch=1,
    )  # fmt: skip
    copy = {k: v.clone() for k, v in runner.state_tensors().items()}
    return StageState(meta, copy)


def want(first: int, last: int, step: int = 3) -> StateWant:
    return StateWant("xfer", MODEL, 5, step, first, last)


def assert_identical(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert got[name].view(-1).view(torch.uint8).tolist() == tensor.view(-1).view(torch.uint8).tolist(), (
            name
        )


class SlowServer(StateServer):
    """Serves each chunk after ``delay_s`` and reports how many it has served."""

    def __init__(self, *args: object, delay_s: float = 0.0, started_after: int = 0, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.delay_s, self.served, self.started_after = delay_s, 0, started_after
        self.started = threading.Event()

    def chunk_bytes(self, served: Served, index: int) -> bytes:
        time.sleep(self.delay_s)  # runs in a worker thread: the event loop keeps going
        self.served += 1
        if self.served >= self.started_after:
            self.started.set()
        return super().chunk_bytes(served, index)


class CorruptServer(StateServer):
    """Flips one bit of chunk 1."""

    def chunk_bytes(self, served: Served, index: int) -> bytes:
        data = bytearray(super().chunk_bytes(served, index))
        if index == 1:
            data[17] ^= 0x04
        return bytes(data)


async def _servers(nodes, kinds, state):
    servers = []
    for (p2p, identity), make in zip(nodes, kinds, strict=True):
        server = make(Streams(p2p), SWARM, identity, CFG)
        server.offer(state)
        await server.start()
        servers.append(server)
    return servers


def test_weights_and_adamw_state_arrive_byte_identical_from_two_holders(tmp_path):
    state = trained_stage(0, 2)

    async def main() -> dict[str, torch.Tensor]:
        async with keyed_group(3, tmp_path) as nodes:
            servers = await _servers(nodes[:2], [StateServer, StateServer], state)
            holders = [Holder(p2p.peer_id.to_base58(), 0, 2) for p2p, _ in nodes[:2]]
            source = PeerSource(Streams(nodes[2][0]), SWARM, holders, CFG)
            fetched = await source.fetch(want(0, 2), 30.0)
            assert all(s.bytes_sent > 0 for s in servers), "chunks were spread over both holders"
            assert fetched.step == 3
            return fetched.tensors

    got = asyncio.run(main())
    assert any(".exp_avg_sq" in k for k in got) and any(k.endswith(".step") for k in got)
    assert_identical(got, state.tensors)


def test_a_fetch_survives_a_holder_dying_mid_transfer(tmp_path, caplog):
    state = trained_stage(0, 2)
    caplog.set_level(logging.WARNING, logger="potluck.transfer.pull")

    async def main() -> tuple[dict[str, torch.Tensor], int]:
        async with keyed_group(3, tmp_path) as nodes:
            (p2p_a, id_a), (p2p_b, id_b), (p2p_c, _) = nodes
            fast = StateServer(Streams(p2p_a), SWARM, id_a, CFG)
            dying = SlowServer(Streams(p2p_b), SWARM, id_b, CFG, delay_s=0.05, started_after=3)
            for server in (fast, dying):
                server.offer(state)
                await server.start()
            holders = [Holder(p2p.peer_id.to_base58(), 0, 2) for p2p in (p2p_a, p2p_b)]
            fetch = asyncio.create_task(
                PeerSource(Streams(p2p_c), SWARM, holders, CFG).fetch(want(0, 2), 30.0)
            )
            assert await asyncio.to_thread(dying.started.wait, 20.0)
            await p2p_b.shutdown()  # the holder's daemon goes away with chunks still owed
            fetched = await fetch
            return fetched.tensors, dying.served

    got, served_by_dead = asyncio.run(main())
    assert_identical(got, state.tensors)
    n_chunks = -(-sum(t.numel() * t.element_size() for t in state.tensors.values()) // CFG.chunk_bytes)
    assert 3 <= served_by_dead < n_chunks
    assert "chunks go to other holders" in caplog.text


def test_a_corrupted_chunk_is_caught_and_fetched_elsewhere(tmp_path, caplog):
    state = trained_stage(0, 2)
    caplog.set_level(logging.WARNING, logger="potluck.transfer.pull")

    async def main() -> dict[str, torch.Tensor]:
        async with keyed_group(3, tmp_path) as nodes:
            await _servers(nodes[:2], [CorruptServer, StateServer], state)
            bad, good = (p2p.peer_id.to_base58() for p2p, _ in nodes[:2])
            fetcher = Streams(nodes[2][0])
            alone = PeerSource(fetcher, SWARM, [Holder(bad, 0, 2)], CFG)
            with pytest.raises(StateError, match="SHA-256"):
                await alone.fetch(want(0, 2), 30.0)
            both = PeerSource(fetcher, SWARM, [Holder(bad, 0, 2), Holder(good, 0, 2)], CFG)
            return (await both.fetch(want(0, 2), 30.0)).tensors

    assert_identical(asyncio.run(main()), state.tensors)
    assert "SHA-256 does not match" in caplog.text


def test_layers_are_recut_from_holders_of_different_stages_and_disk_is_the_fallback(tmp_path):
    old = [trained_stage(0, 2), trained_stage(2, 4)]
    everything = {**rename(old[0].tensors, 0), **rename(old[1].tensors, 2)}
    expected = rename(select(everything, 1, 4, MODEL.n_layers), -1)
    for s in old:
        save_stage(tmp_path / "ck", s.tensors, s.meta)

    async def main() -> tuple[dict[str, torch.Tensor], str]:
        async with keyed_group(3, tmp_path) as nodes:
            servers = await _servers(nodes[:2], [StateServer, StateServer], None)
            for server, s in zip(servers, old, strict=True):
                server.offer(s)
            holders = [
                Holder(nodes[0][0].peer_id.to_base58(), 0, 2),
                Holder(nodes[1][0].peer_id.to_base58(), 2, 4),
            ]
            peers = PeerSource(Streams(nodes[2][0]), SWARM, holders, CFG)
            recut = await peers.fetch(want(1, 4), 30.0)
            assert_identical(recut.tensors, expected)
            with pytest.raises(StateError, match="holds 'xfer' step 3"):
                await peers.fetch(want(1, 4, step=9), 30.0)
            for server in servers:  # the holders moved on: the disk answers
                server.offer(None)
            fetched = await fetch_first([peers, DiskSource(tmp_path / "ck")], want(1, 4), 30.0)
            return fetched.tensors, fetched.source

    tensors, source = asyncio.run(main())
    assert source.startswith("disk:")
    assert_identical(tensors, expected)
    disk = asyncio.run(DiskSource(tmp_path / "ck").fetch(want(1, 4), 30.0))
    assert_identical(disk.tensors, expected)


def test_a_replan_with_new_boundaries_resumes_from_live_holders_without_a_shared_disk(tmp_path):
    """Trainers stop at step 10 with no checkpoint; a new cut starts from their live state and continues
    the uninterrupted run's loss curve."""
    job = tiny_job(checkpoint={"interval": 1000})
    full, _ = asyncio.run(train_swarm(job, 2, 1, [(0, 2), (2, 4)], tmp_path / "full"))
    first, old = asyncio.run(train_swarm(job, 2, 1, [(0, 2), (2, 4)], tmp_path / "old", stop_after=10))
    assert all(r.checkpoint is None for r in first[(0, 0)])  # nothing on any disk at step 10
    held = [old[(0, 0)].snapshot(), old[(1, 0)].snapshot()]
    assert all(h is not None and h.step == 10 for h in held)
    dataset = tiny_dataset(job)

    async def main() -> list[float]:
        async with keyed_group(4, tmp_path) as nodes:
            servers = await _servers(nodes[:2], [StateServer, StateServer], None)
            for server, state in zip(servers, held, strict=True):
                server.offer(state)
            a, b = (p2p.peer_id.to_base58() for p2p, _ in nodes[:2])
            holders = [Holder(a, 0, 2), Holder(b, 2, 4)]
            boxes = [Mailbox(p2p, PROTOCOL, TransportConfig(timeout_s=30)) for p2p, _ in nodes[2:]]
            for box in boxes:
                await box.start()
            plan = make_plan(
                job, [[boxes[0].peer_id], [boxes[1].peer_id]], [(0, 3), (3, 4)], 2, start_step=10
            )
            trainers = [
                Trainer(
                    box,
                    job,
                    plan,
                    dataset,
                    TrainerConfig(step_timeout_s=60),
                    tmp_path / "empty",
                    sources=[
                        DiskSource(tmp_path / "empty"),
                        PeerSource(Streams(box.p2p), SWARM, holders, CFG),
                    ],
                )
                for box in boxes
            ]
            reports: list[StepReport] = []
            await asyncio.gather(trainers[0].run(), trainers[1].run(reports.append))
            for box in boxes:
                await box.close()
            assert [r.step for r in reports] == list(range(10, 20))
            return [r.loss for r in reports]

    got = asyncio.run(main())
    assert got == pytest.approx([r.loss for r in full[(1, 0)][10:]], rel=1e-4, abs=1e-5)


def test_checkpoints_on_a_holders_disk_are_served_recut_and_nothing_else(tmp_path):
    """A holder serves the checkpoints it keeps for a job it was told about (``serve_disk``), re-cut to
    the asked layers; a job it was not told about, or a step it lacks, is refused, never looked up."""
    old = [trained_stage(0, 2), trained_stage(2, 4)]
    everything = {**rename(old[0].tensors, 0), **rename(old[1].tensors, 2)}
    root = tmp_path / "holder-disk"
    for s in old:
        save_stage(root, s.tensors, s.meta)

    async def main() -> dict[str, torch.Tensor]:
        async with keyed_group(2, tmp_path) as nodes:
            (p2p_a, id_a), (p2p_b, _) = nodes
            server = StateServer(Streams(p2p_a), SWARM, id_a, CFG)
            await server.start()
            holder = [Holder(p2p_a.peer_id.to_base58(), 0, 4)]
            source = PeerSource(Streams(p2p_b), SWARM, holder, CFG)
            with pytest.raises(StateError, match="offers no state"):
                await source.fetch(want(1, 3), 30.0)  # nothing offered, no disk served yet
            server.serve_disk("xfer", root)
            with pytest.raises(StateError, match="no checkpoint"):
                await source.fetch(want(1, 3, step=7), 30.0)  # a step it does not keep
            other = StateWant("../../etc", MODEL, 5, 3, 1, 3)
            with pytest.raises(StateError, match="offers no state"):
                await source.fetch(other, 30.0)  # a job name is a key, never a path
            return (await source.fetch(want(1, 3), 30.0)).tensors

    assert_identical(asyncio.run(main()), rename(select(everything, 1, 3, MODEL.n_layers), -1))


def test_a_dead_holder_is_named_unreachable_without_waiting_for_it_to_settle(tmp_path):
    """A holder whose daemon is gone refuses the stream: the fetch fails at once (no settle_s of asking
    again) and names it, so the peer can report it as a suspect."""
    settling = dataclasses.replace(CFG, settle_s=30.0)

    async def main() -> tuple[StateError, str, float]:
        async with keyed_group(2, tmp_path) as nodes:
            (p2p_a, _), (p2p_b, _) = nodes
            dead = p2p_a.peer_id.to_base58()
            await p2p_a.shutdown()
            source = PeerSource(Streams(p2p_b), SWARM, [Holder(dead, 0, 2)], settling)
            started = time.monotonic()
            with pytest.raises(StateError) as caught:
                await fetch_first([source], want(0, 2), 60.0)
            return caught.value, dead, time.monotonic() - started

    err, dead, took = asyncio.run(main())
    assert err.unreachable == {dead}, err
    assert took < 20.0, f"asked a dead holder again for {took:.1f} s"


def test_a_dead_holder_among_settling_ones_does_not_end_the_wait(tmp_path):
    """Churn run H: a spare placed by a hand-off asked for the step the old plan had not reached yet;
    its holders included a peer killed a few seconds before, whose refused stream ended the wait at
    once (0.3 s of a 30 s settle), so the plan failed its start barrier and the swarm re-planned. Now
    the live holder is asked again until it has the step, and the dead one is not dialled again."""
    settling = dataclasses.replace(CFG, settle_s=30.0)
    state = trained_stage(0, 2)

    async def main() -> tuple[dict[str, torch.Tensor], float]:
        async with keyed_group(3, tmp_path) as nodes:
            (p2p_a, _), (p2p_b, _), (p2p_c, id_c) = nodes
            dead = p2p_a.peer_id.to_base58()
            await p2p_a.shutdown()
            server = StateServer(Streams(p2p_c), SWARM, id_c, CFG)
            await server.start()  # offers nothing yet: its run has not reached the step
            asyncio.get_running_loop().call_later(1.0, server.offer, state)
            holders = [Holder(dead, 0, 2), Holder(p2p_c.peer_id.to_base58(), 0, 2)]
            source = PeerSource(Streams(p2p_b), SWARM, holders, settling)
            started = time.monotonic()
            fetched = await fetch_first([source], want(0, 2), 60.0)
            assert [h.peer_id for h in source.holders] == [p2p_c.peer_id.to_base58()], "dead one dropped"
            return fetched.tensors, time.monotonic() - started

    tensors, took = asyncio.run(main())
    assert_identical(tensors, state.tensors)
    assert took < 10.0, f"the fetch took {took:.1f} s after its holder settled at 1 s"


def test_a_peer_serves_the_wider_layers_it_held_and_its_running_state(tmp_path):
    """Measured in the churn benchmark: a peer moved from layers 0-1 to layer 0 offered only layer 0,
    and a holder still inside a step (waiting on a dead leader) offered nothing; the next plan found
    layer 1 nowhere and the job restarted from step 0. Now the wider state stays offered at the same
    step, and a running trainer's state is served between steps."""
    wide, narrow, later = trained_stage(0, 2), trained_stage(0, 1), trained_stage(0, 2, step=4)
    running = trained_stage(2, 4)
    torn = {"now": False}

    async def main() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        async with keyed_group(2, tmp_path) as nodes:
            (p2p_a, id_a), (p2p_b, _) = nodes
            server = StateServer(Streams(p2p_a), SWARM, id_a, CFG)
            await server.start()
            server.offer(wide)
            server.offer(narrow)  # same step, fewer layers: the wide one stays offered
            assert [s.meta.last_layer for s in server.offered_all] == [1, 2]
            server.offer_live(lambda: None if torn["now"] else running)
            source = PeerSource(Streams(p2p_b), SWARM, [Holder(p2p_a.peer_id.to_base58(), 0, 4)], CFG)
            layer1 = (await source.fetch(want(1, 2), 30.0)).tensors
            live = (await source.fetch(want(2, 4), 30.0)).tensors
            torn["now"] = True  # inside the optimizer step: nothing is served rather than a torn state
            server.offer(later)  # a newer step: the older ones stay offered (the newer may be lost)
            assert [s.meta.step for s in server.offered_all] == [4, 3, 3]
            again = (await source.fetch(want(1, 2), 30.0)).tensors
            assert_identical(again, layer1)
            return layer1, live

    layer1, live = asyncio.run(main())
    assert_identical(layer1, rename(select(rename(wide.tensors, 0), 1, 2, MODEL.n_layers), -1))
    assert_identical(live, running.tensors)
