"""The coordinator's check of held sub-networks (``classpar/swarm/check.py``), over in-memory
streams: a unit far below the teacher, or a parity holder naming another copy than the builder's, is
refused; honest holders pass, and a verdict is kept per hash."""

import asyncio

import torch

from potluck.classpar import model, recipe
from potluck.classpar.swarm.check import SubnetChecker
from potluck.classpar.swarm.plan import builder_hashes
from potluck.classpar.swarm.streams import serve_classpar
from potluck.protocol.classpar import ClassParPlan, ClassParSubnet, HeldUnit, HeldWorker
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import parse_job
from tests.unit.classpar.swarm.test_streams import FakeStreams

GROUPS = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
PEERS = sorted(Identity.generate().peer_id for _ in range(4))
JOB = parse_job(
    {
        "name": "bars",
        "kind": "class_parallel",
        "class_parallel": {"groups": 2, "parity": 2, "widths": [4, 4, 4, 4], "train_per_class": 2},
    }
)


def constant(group, favourite: int, strength: float = 10.0) -> model.SmallCNN:
    """A sub-network that always answers output ``favourite`` (0: "not in the group")."""
    torch.manual_seed(0)
    net = model.SmallCNN((4, 4, 4, 4), len(group) + 1)
    with torch.no_grad():
        net.fc.weight.zero_()
        net.fc.bias.zero_()
        net.fc.bias[favourite] = strength
    return net.eval()


def blob(net, group) -> tuple[bytes, str]:
    data = recipe.to_bytes(net, group)
    return data, recipe.sha256(data)


TEACHER, TEACHER_SHA = blob(model.SmallCNN((4, 4, 4, 4), 10).eval(), list(range(10)))
GOOD, GOOD_SHA = blob(constant(GROUPS[0], 0), GROUPS[0])  # always "other": right on half the images
BAD, BAD_SHA = blob(constant(GROUPS[1], 1), GROUPS[1])  # always class 5: right on a tenth
OTHER, OTHER_SHA = blob(constant(GROUPS[0], 0, strength=9.0), GROUPS[0])  # another copy of group 0
BLOBS = {TEACHER_SHA: TEACHER, GOOD_SHA: GOOD, BAD_SHA: BAD}
PLAN = ClassParPlan(
    job="bars",
    epoch=2,
    status="building",
    teacher=PEERS[0],
    teacher_sha256=TEACHER_SHA,
    num_classes=10,
    groups=GROUPS,
    parity=2,
    workers=PEERS,
    issued_at=0.0,
)


def record(peer: str, held: dict[int, dict[int, str]]) -> ClassParSubnet:
    workers = [
        HeldWorker(
            worker=w,
            units=[HeldUnit(unit=u, sha256=sha, macs=1, val_accuracy=1.0) for u, sha in units.items()],
        )
        for w, units in held.items()
    ]
    return ClassParSubnet(
        peer_id=peer, job="bars", teacher_sha256=TEACHER_SHA, groups=GROUPS, held=workers, issued_at=0.0
    )


def test_builder_hashes_come_from_the_systematic_holders():
    recs = [record(PEERS[0], {0: {0: GOOD_SHA}}), record(PEERS[2], {2: {0: OTHER_SHA, 1: BAD_SHA}})]
    assert builder_hashes(PLAN, recs) == {0: GOOD_SHA}


def test_units_below_the_teacher_and_copies_not_the_builders_are_refused():
    async def main():
        streams = FakeStreams(admission=b"ok")

        async def scores(job, worker, x):
            raise LookupError

        async def blobs(job, sha):
            return BLOBS.get(sha)

        await serve_classpar(streams, "swarm-a", scores, blobs, lambda peer, adm: True, 5.0)
        checker = SubnetChecker(streams, "swarm-a", JOB)
        recs = [
            record(PEERS[0], {0: {0: GOOD_SHA}}),
            record(PEERS[1], {1: {1: BAD_SHA}}),
            record(PEERS[2], {2: {0: GOOD_SHA, 1: BAD_SHA}}),
            record(PEERS[3], {3: {0: OTHER_SHA, 1: BAD_SHA}}),
        ]
        accepted = await checker.accepted(PLAN, recs)
        return checker, accepted

    checker, accepted = asyncio.run(main())
    assert [r.peer_id for r in accepted] == [PEERS[0]]
    assert checker.refused == {PEERS[1], PEERS[2], PEERS[3]}
    assert checker.verdicts == {GOOD_SHA: True, BAD_SHA: False}  # OTHER_SHA never fetched
