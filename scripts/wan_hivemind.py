#!/usr/bin/env python3
"""The hivemind baseline of issue 15's headline benchmark: one ``hivemind.Optimizer`` peer per process.

Every peer trains potluck's own job (the demo job of ``potluck/cli/demo_cmd.py:demo_job`` unless
``--job FILE`` names another) in pure data parallel: the WHOLE model in this process, hivemind 1.1.12
averaging gradients. What is matched, and where it comes from:

- model: ``potluck.model.transformer.StageModel(spec, 0, n_layers, job.seed)``, the same per-layer
  seeded init as every potluck stage and the single-process reference (``potluck/model/reference.py``);
- data: ``potluck.model.data.load_dataset(job.data, ...)`` (the generated corpus, byte tokenizer); peer
  r of N takes sequences r, r + N, r + 2N, ... of the stream, which is ``TokenDataset.replica_batch``'s
  rule (replica r of R takes every R-th sequence of the global stream starting at r): disjoint across
  peers, and exactly ``replica_batch(step, r, N, P)`` while peers keep pace and N divides P;
- batch: an optimizer epoch averages ``target_batch_size = job.sequences_per_step`` sequences (the
  potluck job's global batch, 32 x 64 tokens for the demo job); each ``opt.step`` call brings one
  micro-batch (``job.batch.micro_batch_size`` sequences, 4) and its mean-token loss, as a potluck
  micro-batch; hivemind weights each call and each peer by its sample count, so the averaged gradient
  is the gradient of the global batch's mean loss, as in potluck's step;
- optimizer: ``potluck.model.optim.build_optimizer`` (AdamW, betas, eps, weight decay on matrices only,
  foreach=False), clipped by ``clip_coefficient`` on the averaged gradient's global norm, learning rate
  ``learning_rate(spec, epoch, total_epochs)`` (warm-up then cosine) as a hivemind scheduler, which
  hivemind steps once per epoch: epoch e runs at potluck's rate of step e. AdamW's state is created
  the way AdamW creates it (zeros, step 0), so hivemind skips its "virtual step" (a zero-gradient
  AdamW step at the full learning rate: weight decay applied once and Adam's bias correction shifted).

hivemind settings (``HivemindSettings`` below says why each value was chosen): gradient averaging,
not ``use_local_updates`` (which is local SGD plus parameter averaging, another algorithm than
potluck's synchronous step); ``target_group_size`` = N; matchmaking 2 s (the smallest value that
passes hivemind's own tuning rule on loopback) and averaging timeout 60 s (hivemind's internet example,
examples/albert); parameters averaged every epoch (hivemind's default); fp16 (``Float16Compression``)
or 8-bit (``SizeAdaptiveCompression``: ``Uniform8BitQuantization`` for tensors of at least
``--q8-threshold`` elements, fp16 below) on gradients and parameters alike.

Bytes on the wire, two counters per record (``p2pd_sent``/``p2pd_recv`` and ``ns_tx``/``ns_rx``): see
``scripts/_hivemind_wire.py``. The peer's training side is ``scripts/_hivemind_peer.py``.

Output (``--out``, JSON lines): ``{"event": "start", ...}`` once the swarm is complete, then one
``{"event": "epoch", ...}`` per optimizer epoch (wall time, this peer's tokens, the swarm's nominal
tokens = epochs x job.batch.tokens_per_step, this peer's mean loss over the epoch, lr, bytes so far),
and ``{"event": "done", ...}`` with a parameter fingerprint. The swarm's exact tokens at epoch e are
the sum over peers of ``tokens_local`` at epoch e (``swarm_summary`` does that, and the swarm's
sample-weighted loss per epoch). The two differ: an epoch ends when a peer learns that the swarm has
``target_batch_size`` samples, at hivemind's next progress refresh (>= 0.5 s), and the demo's epochs are
~0.3 s of compute, so on loopback 4 peers computed ~3x the target per epoch. Potluck counts
steps x tokens_per_step, i.e. the nominal count; the computed count is the honest cost.

    # first peer: prints {"peer_index": 0, "maddrs": [...]} on stdout
    python scripts/wan_hivemind.py --host 10.0.0.1 --peer-index 0 --n-peers 4 --tokens 614400 \\
        --compression fp16 --out p0.jsonl --print-maddrs
    # the others
    python scripts/wan_hivemind.py --host 10.0.0.2 --initial-peers /ip4/10.0.0.1/tcp/41234/p2p/Qm... \\
        --peer-index 1 --n-peers 4 --tokens 614400 --compression fp16 --out p1.jsonl

Exit status: 0 done, 2 bad arguments, 3 the swarm did not assemble or a hard timeout, 1 other errors.
Children (the DHT and averager processes, the p2p daemon) die with the worker, however it dies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from potluck.protocol.jobspec import JobSpec
from _hivemind_peer import (  # noqa: E402
    HivemindEvents,
    LoopThread,
    PeerShard,
    Recorder,
    children_die_with_this_process,
    fingerprint,
    optimizer_factory,
    param_groups,
    scheduler_factory,
    shutdown,
    start_p2p,
    train,
    wait_for_swarm,
)
from _hivemind_wire import WireCounter  # noqa: E402

logger = logging.getLogger(__name__)

COMPRESSIONS = ("none", "fp16", "8bit")
RUN_ID = "potluck-wan-hivemind"
EXIT_SWARM = 3


# ==== settings ===========================================================================================


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


def make_compression(name: str, q8_threshold: int) -> Any:
    """hivemind's compression for gradients and parameters: ``none``, ``fp16`` or ``8bit``."""
    from hivemind.compression import (
        Float16Compression,
        NoCompression,
        SizeAdaptiveCompression,
        Uniform8BitQuantization,
    )

    if name == "none":
        return NoCompression()
    if name == "fp16":
        return Float16Compression()
    if name == "8bit":
        return SizeAdaptiveCompression(
            threshold=q8_threshold, less=Float16Compression(), greater_equal=Uniform8BitQuantization()
        )
    raise ValueError(f"compression {name!r} is not one of {COMPRESSIONS}")


def load_job_spec(path: Path | None) -> JobSpec:
    """``--job FILE`` (a potluck job TOML), else the demo job (its step count does not matter here)."""
    if path is not None:
        from potluck.protocol.jobspec import load_job

        return load_job(path)
    from potluck.cli.demo_cmd import demo_job

    return demo_job(300, Path(tempfile.gettempdir()) / "potluck-wan-hivemind-unused")


def total_epochs(job: JobSpec, tokens: int | None, epochs: int | None) -> int:
    """Optimizer epochs to train (and the length of the lr schedule): ``--epochs``, else enough epochs of
    ``job.batch.tokens_per_step`` for ``--tokens``, else the job's own steps."""
    if epochs is not None:
        return epochs
    if tokens is not None:
        return max(1, math.ceil(tokens / job.batch.tokens_per_step))
    return job.steps


# ==== data ===============================================================================================


# ==== bytes on the wire ==================================================================================


# ==== processes that die with this one ===================================================================


# ==== what hivemind did each epoch ======================================================================


# ==== the worker =========================================================================================


def run_worker(args: argparse.Namespace, proto: IO[str]) -> int:
    import multiprocessing as mp

    import torch

    torch.set_num_threads(args.threads)
    from potluck.compat import use_fork

    use_fork()
    children_die_with_this_process()
    events = HivemindEvents()
    from hivemind.utils.logging import get_logger

    get_logger("hivemind").addHandler(events)

    from hivemind import DHT, Optimizer

    from potluck.model.data import load_dataset
    from potluck.model.transformer import StageModel

    job = load_job_spec(args.job)
    epochs = total_epochs(job, args.tokens, args.epochs)
    settings = HivemindSettings(
        matchmaking_time=args.matchmaking_time,
        averaging_timeout=args.averaging_timeout,
        target_group_size=args.n_peers,
        average_state_every=args.average_state_every,
        delay_updates=args.delay_updates,
        bandwidth=args.bandwidth,
        q8_threshold=args.q8_threshold,
    )
    dataset, _ = load_dataset(job.data, job.model.seq_len, job.model.vocab_size, job.seed)
    micro = job.batch.micro_batch_size
    shard = PeerShard(dataset, args.peer_index, args.n_peers, micro)
    model = StageModel(job.model, 0, job.model.n_layers, job.seed)
    groups = param_groups(model)
    params = [p for g in groups for p in g["params"]]
    initial = [p.detach().clone() for p in params]

    loop = LoopThread()
    p2p = dht = opt = counter = None
    try:
        p2p = loop.run(start_p2p(args.host, args.initial_peers, args.join_timeout), args.join_timeout + 30)
        dht = DHT(p2p=p2p, initial_peers=args.initial_peers or None, start=False)
        dht.run_in_background(await_ready=True, timeout=args.join_timeout)
        maddrs = [str(m) for m in dht.get_visible_maddrs()]
        if args.print_maddrs:
            proto.write(json.dumps({"peer_index": args.peer_index, "maddrs": maddrs}) + "\n")
            proto.flush()
        p2pd = getattr(getattr(p2p, "_child", None), "pid", None)
        counter = WireCounter(p2pd)
        counter.start()
        compression = make_compression(args.compression, settings.q8_threshold)
        averager_opts: dict[str, Any] = {"target_group_size": settings.target_group_size}
        if settings.bandwidth is not None:
            averager_opts["bandwidth"] = settings.bandwidth
        opt = Optimizer(
            dht=dht,
            run_id=args.run_id,
            target_batch_size=job.sequences_per_step,
            batch_size_per_step=micro,
            params=groups,
            optimizer=optimizer_factory(job),
            scheduler=scheduler_factory(job, epochs),
            matchmaking_time=settings.matchmaking_time,
            averaging_timeout=settings.averaging_timeout,
            average_state_every=settings.average_state_every,
            delay_optimizer_step=settings.delay_updates,
            delay_grad_averaging=settings.delay_updates,
            use_local_updates=False,
            grad_compression=compression,
            state_averaging_compression=compression,
            averager_opts=averager_opts,
            verbose=True,  # status messages at INFO: HivemindEvents reads them (and the log keeps them)
        )
        try:
            peers = wait_for_swarm(
                dht, f"{args.run_id}_ready", args.peer_index, args.n_peers, args.join_timeout
            )
            rec = Recorder(args.out_file)
            rec.write(
                "start",
                peer_index=args.peer_index,
                n_peers=args.n_peers,
                peers_seen=peers,
                pid=os.getpid(),
                p2pd_pid=p2pd,
                child_pids=[c.pid for c in mp.active_children()],
                maddrs=maddrs,
                compression=args.compression,
                epochs=epochs,
                tokens_per_step=job.batch.tokens_per_step,
                target_batch_size=job.sequences_per_step,
                batch_size_per_step=micro,
                seq_len=job.model.seq_len,
                n_params=sum(p.numel() for p in params),
                threads=args.threads,
                hivemind=asdict(settings),
                fingerprint=fingerprint(params),
                model=job.model.model_dump(),
                optimizer=job.optimizer.model_dump(),
                bytes=counter.totals(),
            )
            train(args, rec, opt, model, shard, job, epochs, counter, events)
        except TimeoutError as e:
            logger.error("%s", e)
            return EXIT_SWARM
        counter.stop()
        final = [p.detach() for p in params]
        rec.write(
            "done",
            epoch=opt.local_epoch,
            tokens_local=shard.sequences * job.model.seq_len,
            fingerprint=fingerprint(final),
            param_change=float(
                torch.sqrt(
                    sum(
                        ((a - b).float().pow(2).sum() for a, b in zip(final, initial, strict=True)),
                        torch.zeros(()),
                    )
                )
            ),
            bytes=counter.totals(),
        )
        return 0
    finally:
        shutdown(opt, dht, p2p, loop, args.shutdown_timeout)


# ==== swarm summary (for the drivers) ====================================================================


def read_records(path: Path) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def swarm_summary(records: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The swarm's view from every peer's records: per epoch the exact tokens (sum of the peers'
    ``tokens_local``), the sample-weighted loss and the bytes; tokens/s from the first "start" to the
    last epoch record."""
    epochs: dict[int, list[dict[str, Any]]] = {}
    for peer in records:
        for r in peer:
            if r.get("event") == "epoch":
                epochs.setdefault(int(r["trained_epoch"]), []).append(r)
    starts = [r["time"] for peer in records for r in peer if r.get("event") == "start"]
    done = [r for peer in records for r in peer if r.get("event") == "done"]
    n = len(records)
    curve = []
    for e in sorted(epochs):
        rs = epochs[e]
        samples = sum(r["samples"] for r in rs)
        curve.append(
            {
                "epoch": e,
                "peers": len(rs),
                "tokens": sum(r["tokens_local"] for r in rs),
                "samples": samples,
                "loss": sum(r["loss"] * r["samples"] for r in rs) / max(1, samples),
                "time": max(r["time"] for r in rs),
            }
        )
    complete = [c for c in curve if c["peers"] == n]
    t0 = min(starts) if starts else None
    last = complete[-1] if complete else None
    seconds = (last["time"] - t0) if last and t0 is not None else None

    def total(key: str) -> int | None:
        vals = [r["bytes"].get(key) for r in done]
        return None if not vals or any(v is None for v in vals) else int(sum(vals))

    epoch_records = [r for rs in epochs.values() for r in rs]
    per_step = next(
        (int(r["tokens_per_step"]) for peer in records for r in peer if r.get("event") == "start"), 0
    )
    nominal = (last["epoch"] + 1) * per_step if last else 0
    full = [r.get("grad_group") == n for r in epoch_records]
    tail = complete[-5:]
    sent = total("p2pd_sent")
    return {
        "peers": n,
        "peers_done": len(done),
        "epochs": last["epoch"] + 1 if last else 0,
        # tokens: what the peers computed (hivemind overshoots target_batch_size while the news that an
        # epoch is full travels); nominal: epochs x the job's tokens_per_step, potluck's count per step
        "tokens": last["tokens"] if last else 0,
        "tokens_nominal": nominal,
        "seconds": round(seconds, 2) if seconds is not None else None,
        "tokens_per_s": round(last["tokens"] / seconds, 1) if last and seconds else None,
        "tokens_per_s_nominal": round(nominal / seconds, 1) if nominal and seconds else None,
        "seconds_per_epoch": round(seconds / (last["epoch"] + 1), 3) if last and seconds else None,
        "samples_per_epoch_mean": round(sum(c["samples"] for c in complete) / len(complete), 2)
        if complete
        else None,
        "loss_first": round(complete[0]["loss"], 4) if complete else None,
        "loss_last": round(last["loss"], 4) if last else None,
        "loss_last5_mean": round(sum(c["loss"] for c in tail) / len(tail), 4) if tail else None,
        "final_epochs": sorted({r["epoch"] for r in done}),
        # hivemind's health: the share of peer-epochs whose gradients were averaged by all n peers
        # (its docs: raise matchmaking_time when under 0.9 n on >= 25% of epochs), local fallbacks, and
        # resyncs (full-state downloads) of peers that fell behind
        "full_group_share": round(sum(full) / len(full), 3) if full else None,
        "local_fallbacks": sum(r.get("local_fallback", 0) for r in epoch_records),
        "resyncs": sum(r.get("resync", 0) for r in epoch_records),
        "bytes_sent": sent,
        "bytes_recv": total("p2pd_recv"),
        "bytes_sent_per_epoch": round(sent / (last["epoch"] + 1)) if last and sent is not None else None,
        "curve": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()} for c in curve],
    }


# ==== command line =======================================================================================


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = HivemindSettings()
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--host", default="127.0.0.1", help="address p2pd listens on (or a full multiaddr)")
    ap.add_argument(
        "--initial-peers", nargs="*", default=[], help="multiaddrs of running peers (none for the first)"
    )
    ap.add_argument("--peer-index", type=int, required=True, help="this peer's data shard, 0..n-1")
    ap.add_argument("--n-peers", type=int, required=True, help="peers in the swarm (all of them train)")
    limit = ap.add_mutually_exclusive_group()
    limit.add_argument(
        "--tokens",
        type=int,
        help="train ceil(tokens / job tokens_per_step) optimizer epochs (the potluck job's steps)",
    )
    limit.add_argument("--epochs", type=int, help="train this many optimizer epochs")
    ap.add_argument("--seconds", type=float, help="also stop after this many seconds of training")
    ap.add_argument("--compression", choices=COMPRESSIONS, default="fp16")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the box has 2 cores)")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines: start, one per epoch, done")
    ap.add_argument("--print-maddrs", action="store_true", help="print this peer's multiaddrs as JSON")
    ap.add_argument("--job", type=Path, help="a potluck job TOML (default: the demo job)")
    ap.add_argument("--run-id", default=RUN_ID, help="hivemind run_id, the same on every peer")
    ap.add_argument("--matchmaking-time", type=float, default=d.matchmaking_time, help="seconds")
    ap.add_argument("--averaging-timeout", type=float, default=d.averaging_timeout, help="seconds")
    ap.add_argument("--average-state-every", type=int, default=d.average_state_every, help="epochs")
    ap.add_argument(
        "--delay-updates",
        action="store_true",
        help="delay_optimizer_step + delay_grad_averaging (examples/albert; one epoch stale)",
    )
    ap.add_argument("--bandwidth", type=float, help="this peer's Mbit/s, for hivemind's load balancing")
    ap.add_argument("--q8-threshold", type=int, default=d.q8_threshold, help="8bit: min elements to quantize")
    ap.add_argument(
        "--join-timeout", type=float, default=120.0, help="seconds to reach and assemble the swarm"
    )
    ap.add_argument(
        "--timeout", type=float, default=3600.0, help="hard limit on the whole run, seconds (exit 3)"
    )
    ap.add_argument("--shutdown-timeout", type=float, default=30.0, help="seconds for hivemind's shutdown")
    args = ap.parse_args(argv)
    if not 0 <= args.peer_index < args.n_peers:
        ap.error(f"--peer-index {args.peer_index} is not in 0..{args.n_peers - 1}")
    if args.threads < 1 or args.average_state_every < 1:
        ap.error("--threads and --average-state-every must be at least 1")
    if any(v is not None and v < 1 for v in (args.tokens, args.epochs)):
        ap.error("--tokens and --epochs must be positive")
    return args


def hard_deadline(seconds: float) -> None:
    """Exit with ``EXIT_SWARM`` after ``seconds`` whatever hivemind is waiting on (children die with us)."""

    def fire() -> None:
        logger.error("hard timeout of %.0f s reached; exiting", seconds)
        logging.shutdown()
        os._exit(EXIT_SWARM)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # stdout carries only this worker's JSON lines; anything else printed (hivemind, p2pd) goes to stderr
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    hard_deadline(args.timeout)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as out:
        args.out_file = out
        try:
            return run_worker(args, proto)
        except KeyboardInterrupt:
            return 130
        except Exception:
            logger.exception("worker %d failed", args.peer_index)
            return 1


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    # hivemind leaves non-daemon threads and mp finalizers that can stall interpreter exit
    os._exit(code)
