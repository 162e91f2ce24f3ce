"""The coded outer sync in an untrusted swarm, on real p2pd (in-process peers on loopback): one of four
replicas sends every other replica its outer payloads inflated 1000x. Under ``trust.aggregation =
"trimmed_mean"`` the honest replicas trim it alike, stay bit-identical and train as a clean run does;
under the mean the same attack wrecks the run."""

import asyncio
import math

import pytest
import torch

from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.net.tags import INDEX_BITS, Stream, Tag
from potluck.peer.errors import ContributionError
from potluck.testbed.harness.hostile import forge, rewritten
from potluck.testbed.harness.training import PROTOCOL, tiny_job, train_swarm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

N, HOSTILE = 4, 3


class InflatingMailbox(Mailbox):
    """Sends its coded outer payloads (``Stream.GATHER``) with every value multiplied by 1000, and
    takes its time over the others' echoes, so the honest replicas' verdict is the one that counts."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.forged: dict[tuple[int, int, int], bytes] = {}  # the same forged bytes to every replica

    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        if tag.stream >> INDEX_BITS == Stream.GATHER:
            key = (tag.round, tag.stream, tag.chunk)

            def inflated(p: bytes) -> bytes:
                return self.forged.setdefault(key, forge(p, lambda x: 1000.0 * x))

            payload = rewritten(self, peer, tag, payload, inflated)
        await super().send(peer, tag, payload)

    async def recv(self, peer: str, tag: Tag, timeout_s: float | None = None) -> bytes:
        if tag.stream >> INDEX_BITS == Stream.GATHER_ECHO:  # the attacker checks nobody: it stalls
            await asyncio.sleep(timeout_s or 0.0)
        return await super().recv(peer, tag, timeout_s)


def job(rule: str):
    return tiny_job(
        steps=12,
        batch={"tokens_per_step": 16 * 8},  # 2 sequences a replica
        compression={"sync_every": 2, "outer": "int2:block=32|zstd"},
        trust={"aggregation": rule, "trim": 0.25},
    )


def inflate(_key, _report, trainers) -> None:  # type: ignore[no-untyped-def]
    """The attacker's pseudo-gradients, 1000x: coded and sent to everyone alike, echoed truthfully; its
    own weights stay honest (its outer step carries its true pseudo-gradient)."""
    d = trainers[(0, HOSTILE)].diloco
    if not getattr(d, "inflated", False):
        honest = d.encode_outer
        d.encode_outer = lambda flat=None: honest(1000.0 * (d.pseudo_gradient() if flat is None else flat))
        d.inflated = True


def run(tmp_path, rule: str, attack: bool):
    hook = inflate if attack else None
    return asyncio.run(train_swarm(job(rule), 1, N, [(0, 4)], tmp_path, aggregation=rule, on_step=hook))


def test_the_trimmed_mean_holds_off_an_inflating_replica_and_keeps_replicas_identical(tmp_path):
    clean, _ = run(tmp_path / "clean", "trimmed_mean", attack=False)
    attacked, trainers = run(tmp_path / "trimmed", "trimmed_mean", attack=True)
    wrecked, _ = run(tmp_path / "mean", "mean", attack=True)
    base = clean[(0, 0)][-1].loss
    assert all(len(r) == 12 for r in attacked.values())  # no step lost to the attack
    assert abs(attacked[(0, 0)][-1].loss - base) < 0.05 * base
    last = wrecked[(0, 0)][-1].loss
    assert not math.isfinite(last) or last > 1.5 * base  # the plain mean takes the attack
    honest = [trainers[(0, i)].runner.params for i in range(N) if i != HOSTILE]
    for params in honest[1:]:
        assert all(torch.equal(a, b) for a, b in zip(honest[0], params, strict=True))
    attacker = trainers[(0, HOSTILE)].box.peer_id
    for i in range(N):
        audit = trainers[(0, i)].audit
        if i != HOSTILE:
            assert audit.clipped[attacker] >= 3 and audit.seen[attacker] == 6, audit.clipped


def test_a_replica_whose_echo_contradicts_what_it_sent_is_named(tmp_path):
    """Inflating its payloads on the wire but echoing its true ones: every honest replica sees the
    contradiction between two messages of the same peer, fails the sync and names that peer."""

    def box(replica: int, node):  # type: ignore[no-untyped-def]
        cls = InflatingMailbox if replica == HOSTILE else Mailbox
        return cls(node, PROTOCOL, TransportConfig(timeout_s=30))

    with pytest.raises(ContributionError) as err:
        asyncio.run(
            train_swarm(
                job("trimmed_mean"), 1, N, [(0, 4)], tmp_path, aggregation="trimmed_mean", make_box=box
            )
        )
    assert "contradicts the payload it sent" in str(err.value)
