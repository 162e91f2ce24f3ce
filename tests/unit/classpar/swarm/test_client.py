"""The swarm side of class-parallel serving without the network: what a holder replies
(``recipe.worker_reply``), what ``potluck serve`` decodes and merges (``classpar.swarm.client.answer``), the
model blobs peers exchange (``recipe.to_bytes``/``load_unit``) and the bounds on queries."""

import asyncio

import numpy as np
import pytest
import torch

from potluck.classpar import model, recipe, subnet
from potluck.classpar.errors import ClassParallelError, CodeError
from potluck.classpar.swarm import client as serve_client
from potluck.classpar.swarm.client import answer, checked_answer
from potluck.classpar.swarm.streams import _images
from potluck.cli.serve_cmd import parse_query
from potluck.protocol.classpar import ClassParPlan
from potluck.protocol.errors import WireError
from potluck.protocol.identity import Identity
from potluck.protocol.keys import JobKeys

GROUPS = [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
PEERS = [Identity.generate().peer_id for _ in range(4)]


def units() -> dict[int, recipe.Unit]:
    out = {}
    for u, group in enumerate(GROUPS):
        torch.manual_seed(u)
        net = model.SmallCNN((4, 6, 6, 8), len(group) + 1).eval()
        blob = recipe.to_bytes(net, group)
        out[u] = recipe.Unit(subnet.Subnet(net, group, model.model_macs(net)), blob, recipe.sha256(blob), 0.0)
    return out


def plan(parity: int, code: str = "cauchy") -> ClassParPlan:
    return ClassParPlan(
        code=code,
        job="bars",
        epoch=2,
        status="serving",
        teacher=PEERS[0],
        teacher_sha256="00" * 32,
        num_classes=10,
        groups=GROUPS,
        parity=parity,
        workers=PEERS[: 2 + parity],
        issued_at=0.0,
    )


def holders(p: ClassParPlan, dead=(), hung=(), liar=None):
    code = recipe.make_code(p.code, len(p.groups), p.parity)
    held = units()

    async def ask(worker: int, x: np.ndarray) -> np.ndarray:
        if worker in dead:
            raise WireError("cannot open a stream: connection refused")
        if worker in hung:
            await asyncio.sleep(3600)
        reply = recipe.worker_reply(code, worker, held, torch.from_numpy(x))
        return reply + np.asarray(0.05, dtype=reply.dtype) if worker == liar else reply

    return ask


X = np.random.default_rng(0).normal(size=(3, 1, 16, 16)).astype(np.float32)


def run(p, ask, timeout_s=5.0):
    return asyncio.run(answer(p, ask, X, timeout_s))


def test_replies_are_float32_scores_or_float64_parities():
    p = plan(2)
    code = recipe.make_code(p.code, 2, 2)
    held = units()
    assert recipe.worker_reply(code, 0, held, torch.from_numpy(X)).dtype == np.float32
    parity = recipe.worker_reply(code, 3, held, torch.from_numpy(X))
    assert parity.dtype == np.float64 and parity.shape == (3, 5)
    with pytest.raises(ClassParallelError, match="not held"):
        recipe.worker_reply(code, 2, {0: held[0]}, torch.from_numpy(X))


def test_answers_with_dead_or_hung_holders_equal_the_all_alive_answer_exactly():
    p = plan(2)
    alive = run(p, holders(p))
    assert alive.scores.dtype == np.float32 and alive.scores.shape == (3, 10)
    # class order: group blocks are put back where their classes belong
    direct = recipe.worker_reply(recipe.make_code("cauchy", 2, 2), 1, units(), torch.from_numpy(X))
    assert np.array_equal(alive.scores[:, [1, 3, 5, 7, 9]], direct)
    for dead in ([0], [1], [0, 1], [0, 3]):
        got = run(p, holders(p, dead=dead))
        assert np.array_equal(got.scores, alive.scores), dead
        assert not set(dead) & set(got.workers)
    hung = run(p, holders(p, hung=[0]), timeout_s=2.0)
    assert np.array_equal(hung.scores, alive.scores) and 0 not in hung.workers
    with pytest.raises(CodeError, match="not enough"):
        run(p, holders(p, dead=[0, 1, 2]))


def test_group_parities_stand_in_for_their_own_group():
    p = plan(2, code="group")  # one parity per group of units: here one per sub-network
    alive = run(plan(2), holders(plan(2)))
    for dead in ([0], [1], [0, 3], [1, 2]):
        assert np.array_equal(run(p, holders(p, dead=dead)).scores, alive.scores), dead
    with pytest.raises(CodeError):
        run(p, holders(p, dead=[0, 2]))  # group 0's sub-network and its parity


def test_uncoded_serving_needs_every_group():
    p = plan(0)
    coded = run(plan(2), holders(plan(2)))
    assert np.array_equal(run(p, holders(p)).scores, coded.scores)
    with pytest.raises(CodeError):
        run(p, holders(p, dead=[1]))


def test_model_blobs_round_trip_and_are_checked():
    unit = units()[1]
    loaded = recipe.load_unit(unit.blob, unit.sha256, GROUPS[1])
    assert torch.equal(
        model.predict(loaded.subnet.model, torch.from_numpy(X)),
        model.predict(unit.subnet.model, torch.from_numpy(X)),
    )
    with pytest.raises(ClassParallelError, match="hash"):
        recipe.load_unit(unit.blob, "ab" * 32, GROUPS[1])
    with pytest.raises(ClassParallelError, match="not group"):
        recipe.load_unit(unit.blob, unit.sha256, GROUPS[0])
    with pytest.raises(ClassParallelError, match="not a serialized"):
        recipe.from_bytes(b"garbage" * 10)


def test_a_query_may_be_a_npy_path(tmp_path):
    path = tmp_path / "q.npy"
    np.save(path, np.ones((2, 16, 16), dtype=np.float64))
    qid, x = parse_query(f"{path}\n", 3)
    assert qid == str(path) and x.shape == (2, 1, 16, 16) and x.dtype == np.float32
    with pytest.raises(OSError):
        parse_query(str(tmp_path / "missing.npy"), 4)


def test_queries_are_bounded():
    qid, x = parse_query('{"id": "a", "x": ' + str(np.zeros((16, 16)).tolist()) + "}", 1)
    assert qid == "a" and x.shape == (1, 1, 16, 16)
    for bad in ('{"x": [[1, 2], [3, 4]]}', '{"y": 1}', '{"x": ' + str(np.zeros((65, 16, 16)).tolist()) + "}"):
        with pytest.raises(ValueError):
            parse_query(bad, 1)
    raw = np.zeros((2, 1, 16, 16), dtype="<f4")
    assert _images([2, 1, 16, 16], raw.tobytes()).shape == (2, 1, 16, 16)
    for shape, data in (
        ([2, 1, 16, 16], raw.tobytes()[:-4]),
        ([100, 1, 16, 16], b""),
        ([2, 3, 16, 16], raw.tobytes()),
    ):
        with pytest.raises(ValueError):
            _images(shape, data)
    with pytest.raises(ValueError, match="finite"):
        _images([1, 1, 2, 2], np.array([0, 0, 0, np.nan], dtype="<f4").tobytes())


def test_a_checked_answer_finds_a_lying_holder_and_answers_without_it():
    p = plan(2)
    honest = run(p, holders(p))
    checked = asyncio.run(checked_answer(p, holders(p), X, 5.0))
    assert checked.consistent is True and checked.suspect is None
    assert np.array_equal(checked.scores, honest.scores)
    for liar in (0, 1, 3):
        lied = asyncio.run(checked_answer(p, holders(p, liar=liar), X, 5.0))
        assert lied.consistent is False and lied.suspect == liar
        assert np.array_equal(lied.scores, honest.scores) and liar not in lied.workers
    # two replies of four: they decode, but nothing is left to compare them with
    short = asyncio.run(checked_answer(p, holders(p, dead=[0, 3]), X, 5.0))
    assert short.consistent is None and np.array_equal(short.scores, honest.scores)
    # one parity: a disagreement is seen, but who lied cannot be told
    p1 = plan(1)
    seen = asyncio.run(checked_answer(p1, holders(p1, liar=0), X, 5.0))
    assert seen.consistent is False and seen.suspect is None


class FakeNode:
    """What ``ServeClient`` reads from a swarm node: the newest records under a key."""

    class P2P:
        class Id:
            def to_base58(self) -> str:
                return PEERS[0]

        peer_id = Id()

    def __init__(self) -> None:
        self.p2p = self.P2P()
        self.admission = None
        self.records: dict[str, list] = {}

    async def fetch(self, name: str) -> list:
        return [type("Verified", (), {"record": r})() for r in self.records.get(name, [])]


def test_a_long_running_client_follows_a_newer_serving_plan(monkeypatch):
    node, keys = FakeNode(), JobKeys("bars")
    client = serve_client.ServeClient(node, "swarm-a", keys, plan(2), 5.0)
    redealt = plan(2).model_copy(update={"epoch": 3, "workers": [PEERS[1], PEERS[1], PEERS[2], PEERS[3]]})
    node.records[keys.classpar] = [redealt]
    assert asyncio.run(client.refresh()) is False and client.plan.epoch == 2  # read less than 10 s ago
    monkeypatch.setattr(serve_client, "PLAN_REFRESH_S", 0.0)
    node.records[keys.classpar] = [redealt.model_copy(update={"status": "building"})]
    assert asyncio.run(client.refresh()) is False and client.plan.epoch == 2  # not serving yet
    node.records[keys.classpar] = [redealt]
    assert asyncio.run(client.refresh()) is True and client.plan == redealt
    node.records[keys.classpar] = [plan(2)]  # an older epoch never replaces a newer one
    assert asyncio.run(client.refresh()) is False and client.plan == redealt
