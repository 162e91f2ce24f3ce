"""Gradient checks without a network: a replica recomputes a peer's step from the data every replica has
and compares it with the slices that peer sent it, within the codec's error; and who gets checked."""

from collections import Counter

import pytest
import torch

from potluck.compression import ErrorFeedback, decode, get_codec
from potluck.model.stage import StageRunner
from potluck.net.tags import Direction, Round, Stream, make_tag
from potluck.peer.collectives.buckets import _bucketize
from potluck.peer.collectives.robust import Audit
from potluck.peer.collectives.tree import tree_chunks
from potluck.peer.config import AllReduceConfig
from potluck.peer.seal import Ledger, key_of
from potluck.peer.train.checks.recheck import RECHECK_STEPS, GradientChecks
from potluck.peer.train.commit import Decision
from potluck.protocol.collective import one_hop_schedule
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import TrustSpec
from potluck.testbed.harness.hostile import raw_payload
from potluck.testbed.harness.training import tiny_job

CODEC = "int8:block=64"
JOB = tiny_job()


def batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        tokens = torch.randint(0, JOB.model.vocab_size, (2, JOB.model.seq_len + 1), generator=gen)
        out.append((tokens[:, :-1], tokens[:, 1:], 0.25))
    return out


class Setup:
    """Replica 0 (``me``) owns one shard of a one-hop schedule over four replicas; ``suspect`` sent it
    its slices of step 7, sealed, through the real bucket cut, error feedback and codec."""

    def __init__(self, forge=lambda x: x, steps_before: int = 2, spec: str = CODEC) -> None:
        self.ids = [Identity.generate() for _ in range(4)]
        self.peers = [i.peer_id for i in self.ids]
        self.me, self.suspect = self.peers[0], self.peers[2]
        self.runner = StageRunner(JOB.model, 0, JOB.model.n_layers, JOB.seed, JOB.optimizer)
        self.schedule = one_hop_schedule(tuple(self.peers))
        self.cfg = AllReduceConfig(codec=spec, chunk_elements=4096, average=False, rule="centered_clip")
        sizes = [p.numel() for p in self.runner.params]
        self.buckets = _bucketize(sizes, max(1, sum(sizes) // 4))
        self.ledger = Ledger(self.ids[0])
        self.audit = Audit()
        self.duty = GradientChecks(
            self.runner,
            None,  # type: ignore[arg-type]  # the check sends nothing
            self.peers,
            self.schedule,
            self.buckets,
            self.ledger,
            self.cfg,
            TrustSpec(spot_checks=0.0),
            self.audit,
            lambda step, replica: [],
            True,
            "t/0",
        )
        # the suspect's error feedback carries a residual from earlier steps, as in a real run
        codec = get_codec(spec)
        feedback = [ErrorFeedback() for _ in self.buckets]
        sender = StageRunner(JOB.model, 0, JOB.model.n_layers, JOB.seed, JOB.optimizer)
        for step in range(steps_before + 1):
            grads = sender.recompute_gradients(
                sender.frozen_copy(), batches(100 + step if step < steps_before else 7)
            )
            if step < steps_before:
                for b, members in enumerate(self.buckets):
                    flat = torch.cat([grads[i].reshape(-1) for i in members])
                    codec.encode(flat, key=(0, 0, 0), state=feedback[b])
        self.grads = grads
        sealer = Ledger(self.ids[2])  # the suspect's
        for b, members in enumerate(self.buckets):
            flat = torch.cat([grads[i].reshape(-1) for i in members])
            flat = forge(decode(codec.encode(flat, key=(0, 0, 0), state=feedback[b])))
            round_no = Round(1, 7).bucket(b).pack()
            for t, chunks in enumerate(tree_chunks(flat, self.schedule, self.cfg)):
                if self.schedule.trees[t].root != self.me:
                    continue
                for c, chunk in enumerate(chunks):
                    tag = make_tag(round_no, Stream.TREE, index=t, chunk=c, direction=Direction.REDUCE)
                    finite = bool(torch.isfinite(chunk).all())  # a forged NaN goes raw, as an attacker can
                    payload = codec.encode(chunk.contiguous()) if finite else raw_payload(chunk.contiguous())
                    (sealed,) = sealer.seal_together([(self.me, tag, payload)])
                    self.ledger.received[(self.suspect, key_of(tag))] = sealed  # as the owner keeps it

    def verdict(self) -> str | None:
        sent = self.duty._sent(Round(1, 7), self.suspect)
        assert sent is not None and len(sent.rows) >= len(self.buckets)
        model = self.runner.frozen_copy()
        return self.duty._verdict(sent, self.runner.recompute_gradients(model, batches(7)))


def test_an_honest_contribution_with_error_feedback_holds_up():
    assert Setup().verdict() is None


@pytest.mark.parametrize(
    "forge,why,spec",
    [
        (lambda x: -x, "off its recomputation", CODEC),
        (lambda x: 100.0 * x, "off its recomputation", CODEC),
        (lambda x: x + 3.0 * x.pow(2).mean().sqrt() * torch.randn(x.shape), "off its recomputation", CODEC),
        (lambda x: torch.where(torch.arange(x.numel()) == 5, float("nan"), x), "NaN or Inf", "none"),
    ],
    ids=["sign-flip", "x100", "noise", "nan"],
)
def test_a_poisoned_contribution_fails(forge, why, spec):
    problem = Setup(forge, spec=spec).verdict()
    assert problem is not None and why in problem, problem


def test_the_recomputation_matches_the_live_backward():
    """What the checker recomputes on a copy is what the replica's own forward/backward accumulates."""
    runner = StageRunner(JOB.model, 0, JOB.model.n_layers, JOB.seed, JOB.optimizer)
    for m, (x, y, w) in enumerate(batches(3)):
        runner.forward(m, x, y, w)
        runner.backward(m)
    again = runner.recompute_gradients(runner.frozen_copy(), batches(3))
    for p, g in zip(runner.params, again, strict=True):
        assert torch.equal(p.grad, g)


def test_who_is_checked_and_how_often():
    s = Setup()
    decision = Decision(True, (1.0,), 2.0)
    s.duty.before_step()
    assert s.duty.suspects(Round(1, 3), decision) == []  # nothing clipped, no random checks
    s.audit.seen[s.suspect] += 10
    s.audit.clipped[s.suspect] += 1  # one slice of ten strayed: honest noise, no recomputation
    assert s.duty.suspects(Round(1, 3), decision) == []
    s.duty.before_step()
    s.audit.seen[s.suspect] += 10
    s.audit.clipped[s.suspect] += 12  # clipped again, and 13 of its 20 slices so far: recompute it
    assert s.duty.suspects(Round(1, 3), decision) == [s.suspect]
    s.duty._last[s.suspect] = 3  # checked at step 3: not again before step 3 + RECHECK_STEPS
    s.duty.before_step()
    s.audit.clipped[s.suspect] += 1
    assert s.duty.suspects(Round(1, 3 + RECHECK_STEPS - 1), decision) == []
    assert s.duty.suspects(Round(1, 3 + RECHECK_STEPS), decision) == [s.suspect]
    s.audit.failed[s.suspect] += 1  # caught once: its testimony stands, no more compute spent on it
    assert s.duty.suspects(Round(1, 100), decision) == []
    # with random checks every step, a replica draws one of the others, never itself
    s.duty.trust = TrustSpec(spot_checks=1.0)
    s.duty.before_step()
    drawn = Counter(
        tuple(s.duty.suspects(Round(1, step), Decision(True, (float(step),), 1.0))) for step in range(40)
    )
    assert sum(drawn.values()) == 40 and all(len(k) == 1 and k[0] != s.me for k in drawn)
    assert len(drawn) >= 2  # not always the same peer


def test_a_banned_peer_costs_no_recomputation():
    s = Setup()
    s.duty.before_step()
    s.audit.seen[s.suspect] += 10
    s.audit.refused[s.suspect] += 10  # its rows are left out as banned: refused at every step
    assert s.duty.suspects(Round(1, 3), Decision(True, (1.0,), 2.0)) == [s.suspect]  # unless banned
    s.audit.excluded.add(s.suspect)
    assert s.duty.suspects(Round(1, 3), Decision(True, (1.0,), 2.0)) == []
