"""The hivemind baseline of issue 15's headline benchmark: one ``hivemind.Optimizer`` peer per process.

``python -m potluck.testbed.baseline.worker`` (or ``scripts/wan_hivemind.py``, the same command line):
one peer of the swarm, training the job in pure data parallel (what is matched against potluck: this
package's docstring). Records go to ``--out`` as JSON lines: ``start`` once the swarm is complete, one
``epoch`` per optimizer epoch, ``done`` with a parameter fingerprint; ``--print-maddrs`` prints this
peer's multiaddrs on stdout, which carries nothing else. Exit status: 0 done, 2 bad arguments, 3 the
swarm did not assemble or a hard timeout, 1 other errors. Children (the DHT and averager processes, the
p2p daemon) die with the worker, however it dies.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import torch
from hivemind import DHT, Optimizer
from hivemind.utils.logging import get_logger

from potluck.compat import use_fork
from potluck.model.data import load_dataset
from potluck.model.transformer import StageModel
from potluck.testbed.baseline.peer import (
    HivemindEvents,
    LoopThread,
    children_die_with_this_process,
    make_compression,
    shutdown,
    start_p2p,
    wait_for_swarm,
)
from potluck.testbed.baseline.settings import (
    COMPRESSIONS,
    EXIT_SWARM,
    RUN_ID,
    HivemindSettings,
    load_job_spec,
    total_epochs,
)
from potluck.testbed.baseline.training import (
    PeerShard,
    Recorder,
    fingerprint,
    optimizer_factory,
    param_groups,
    scheduler_factory,
    train,
)
from potluck.testbed.baseline.wire import WireCounter

logger = logging.getLogger(__name__)


def run_worker(args: argparse.Namespace, proto: IO[str]) -> int:
    """Train as one peer of the swarm, writing records to ``args.out_file``; the return is the exit
    status. ``proto`` (the real stdout) carries only this peer's multiaddrs (``--print-maddrs``)."""
    torch.set_num_threads(args.threads)
    use_fork()  # hivemind's DHT and averager are fork children (docs/development.md, Multiprocessing)
    children_die_with_this_process()
    events = HivemindEvents()
    get_logger("hivemind").addHandler(events)

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


def parse_args(argv: list[str] | None = None, doc: str | None = None) -> argparse.Namespace:
    """The worker's command line (``scripts/wan_hivemind.py``'s); ``doc``'s first line describes it."""
    d = HivemindSettings()
    ap = argparse.ArgumentParser(
        description=(doc or __doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
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


def main(argv: list[str] | None = None, doc: str | None = None) -> int:
    """Run one worker; the return is its exit status (``end_process`` ends the process without waiting on
    hivemind's leftovers)."""
    args = parse_args(argv, doc)
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


def end_process(code: int) -> None:
    """End the process with ``code`` at once: hivemind leaves non-daemon threads and multiprocessing
    finalizers that can stall interpreter exit."""
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    end_process(main())
