"""The hivemind baseline's settings: ``hivemind.Optimizer``'s options and why each value, the job it
trains, and how many epochs. Light: neither torch nor hivemind is imported here, so a driver can read
the defaults without loading them."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from potluck.protocol.jobspec import JobSpec, load_job
from potluck.testbed.demojob import demo_job

COMPRESSIONS = ("none", "fp16", "8bit")
RUN_ID = "potluck-wan-hivemind"
EXIT_SWARM = 3  # a worker's exit status when the swarm did not assemble or the hard timeout fired


@dataclass(frozen=True)
class HivemindSettings:
    """``hivemind.Optimizer`` options, each as hivemind's documentation or its examples recommend."""

    # Seconds a matchmaking leader waits for followers (``min_matchmaking_time``; also the pre-scheduling
    # horizon and the per-chunk timeout); in practice every epoch lasts about this long plus the
    # all-reduce, whatever target_group_size. hivemind's docstring: "3-5 s for small local runs, 10-15 s
    # for training over the internet", and its tuning rule: "increase if you see 'averaged gradients
    # with N peers' where N is below 0.9x the real size on >= 25% of epochs"; "decreasing matchmaking_time
    # allows training with smaller batch sizes". Our epochs are tiny (32 sequences, ~0.1 s of compute per
    # peer), so the smallest value that passes the rule is the fair one: on loopback with 3 peers, 1 s
    # gave full groups on 55% of peer-epochs (fails), 2 s on 91-98% (passes). On emulated home links,
    # check ``full_group_share`` in the summary and raise it (3, 5 s) if under 0.75.
    matchmaking_time: float = 2.0
    # Seconds before an averaging round is abandoned (then the peer steps with its local gradients).
    # Docstring: "around 2x the actual time it takes to run all-reduce"; examples/albert uses 60 s. In
    # an fp16 butterfly all-reduce of the demo model (0.92 M parameters, 1.84 MB) each of N peers uploads
    # 2 (N-1)/N x 1.84 MB (its parts out, the averages of its own part back): 2.5 MB for N = 3, 2-10 s
    # at home upload rates of 2-10 Mbit/s, well inside it.
    averaging_timeout: float = 60.0
    # Peers per all-reduce group: the swarm's size, all of it in every round (pure data parallel).
    target_group_size: int = 2
    # Average parameters every this many epochs (hivemind's default 1: parameters drift apart under lossy
    # compression or a missed round, and this pulls them back; it costs one more all-reduce per epoch,
    # doubling the bytes). Measured without it (fp16, 2 peers, 12 epochs, every round complete): the
    # peers' weights differed by ~2e-5 of how far they had moved; a leaner variant can pass e.g. 10.
    average_state_every: int = 1
    # delay_optimizer_step + delay_grad_averaging (examples/albert sets both: one epoch of staleness in
    # exchange for overlapping the all-reduce with the next epoch's compute). Off by default so that
    # "loss after the same tokens" compares synchronous SGD with synchronous SGD; when communication is
    # ~10x compute the overlap can hide at most one epoch's compute, <= ~10% of the step.
    delay_updates: bool = False
    # This peer's bandwidth in Mbit/s for hivemind's butterfly load balancing (None: equal shares).
    bandwidth: float | None = None
    # 8-bit: tensors with at least this many elements go Uniform8BitQuantization, smaller ones fp16.
    # The recipe in hivemind's examples (sahajBERT) uses 2**16 + 1 to keep biases and norm gains in fp16
    # while every matrix of their models is larger; this model's matrices hold 16 Ki-96 Ki elements and
    # its gains 128, so the same split (matrices 8-bit, gains fp16) needs a lower threshold.
    q8_threshold: int = 2**10 + 1


def load_job_spec(path: Path | None) -> JobSpec:
    """``--job FILE`` (a potluck job TOML), else the demo job (its step count does not matter here)."""
    if path is not None:
        return load_job(path)
    return demo_job(300, Path(tempfile.gettempdir()) / "potluck-wan-hivemind-unused")


def total_epochs(job: JobSpec, tokens: int | None, epochs: int | None) -> int:
    """Optimizer epochs to train (and the length of the lr schedule): ``--epochs``, else enough epochs of
    ``job.batch.tokens_per_step`` for ``--tokens``, else the job's own steps."""
    if epochs is not None:
        return epochs
    if tokens is not None:
        return max(1, math.ceil(tokens / job.batch.tokens_per_step))
    return job.steps
