"""Which states a peer keeps offering from memory (``StateServer.offer``): older states of the job stay
offered, newest first, unless the new one covers them, up to ``keep_states`` in ``keep_bytes``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import ModelSpec
from potluck.transfer.server import StateServer, TransferConfig
from potluck.transfer.snapshot import StageState

MODEL = ModelSpec(n_layers=4, d_model=16, n_heads=2, vocab_size=32, seq_len=8)
ID = Identity.generate()


def state(step: int, first: int, last: int, job: str = "j", numel: int = 256) -> StageState:
    meta = StageMeta(
        job=job, step=step, stage=0, n_stages=1, first_layer=first, last_layer=last, model=MODEL, seed=1,
        tokenizer=None, epoch=1,
    )  # fmt: skip
    return StageState(meta, {"model.w": torch.zeros(numel)})


def server(**cfg: int) -> StateServer:
    streams = SimpleNamespace(peer_id=ID.peer_id)  # offer() touches no stream
    return StateServer(streams, "s", ID, TransferConfig(**cfg))  # type: ignore[arg-type]


def held(s: StateServer) -> list[tuple[str, int, int, int]]:
    return [(x.meta.job, x.meta.step, x.meta.first_layer, x.meta.last_layer) for x in s.offered_all]


def test_older_states_stay_offered_newest_first_until_covered():
    s = server()
    s.offer(state(736, 3, 4))
    s.offer(state(736, 0, 3))  # moved to stage 0: layer 3 at 736 may be nowhere else
    s.offer(state(816, 0, 3))  # trained on: 736 stays, in case 816 loses its other stage
    assert held(s) == [("j", 816, 0, 3), ("j", 736, 0, 3), ("j", 736, 3, 4)]
    s.offer(state(816, 0, 4))  # covers the 816 piece only
    assert held(s) == [("j", 816, 0, 4), ("j", 736, 0, 3), ("j", 736, 3, 4)]


def test_another_job_and_none_clear_them():
    s = server()
    s.offer(state(5, 0, 2))
    s.offer(state(7, 0, 2, job="other"))
    assert held(s) == [("other", 7, 0, 2)]
    s.offer(None)
    assert held(s) == []


@pytest.mark.parametrize(
    ("keep_states", "keep_bytes", "kept"), [(3, 4 << 30, 3), (1, 4 << 30, 1), (3, 2048, 2)]
)
def test_the_older_states_are_bounded_by_count_and_bytes(keep_states: int, keep_bytes: int, kept: int):
    s = server(keep_states=keep_states, keep_bytes=keep_bytes)
    for step in range(1, 6):  # 1 KiB each
        s.offer(state(step, 0, 4))
    assert [x.meta.step for x in s.offered_all] == [5, 4, 3, 2][: kept + 1]
