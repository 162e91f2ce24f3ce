"""One peer process of scripts/bench_vs_hivemind.py: a hivemind DHT on its namespace's address, and on it both
systems, each timed on the driver's "go": hivemind's DecentralizedAverager, potluck's tree all-reduce and
ring all-reduce over a Mailbox; every result is checked against the true mean."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

PROTOCOL = "potluck/bench/vs-hivemind/1"  # the mailbox protocol of the potluck side


def _input(seed: int, index: int, elements: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + index)
    return torch.randn(elements, generator=g)


def worker_main(args: argparse.Namespace) -> None:
    """One peer: a hivemind DHT + DecentralizedAverager + potluck Mailbox; JSON commands on stdin."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints go to the log, not into the protocol stream

    def reply(**kw: Any) -> None:
        proto.write(json.dumps(kw) + "\n")
        proto.flush()

    import asyncio

    import torch

    torch.set_num_threads(1)
    from potluck.compat import use_fork

    use_fork()
    from hivemind import DHT
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.control import AveragingStage
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    from potluck.net.config import TransportConfig
    from potluck.net.mailbox import Mailbox
    from potluck.peer.collectives.tree import ring_allreduce, tree_allreduce
    from potluck.peer.config import AllReduceConfig
    from potluck.protocol.collective import AllReduceSchedule, TreeSpec

    n, me = args.n, args.index
    x = _input(args.data_seed, me, args.elements)
    acc = torch.zeros(args.elements, dtype=torch.float64)
    for j in range(n):
        acc += _input(args.data_seed, j, args.elements).double()
    truth = acc / n
    del acc

    def err(t: Any) -> float:
        return float((t.reshape(-1).double() - truth).abs().max())

    dht = DHT(
        initial_peers=json.loads(args.boot) or None,
        start=True,
        host_maddrs=[f"/ip4/{args.addr}/tcp/0"],
        nat_port_map=False,
        auto_nat=False,
        use_relay=False,
    )
    averager = DecentralizedAverager(
        [x.clone()],
        dht,
        start=True,
        prefix="plbench",
        target_group_size=n,
        min_group_size=n,
        min_matchmaking_time=args.matchmaking_s,
        request_timeout=0.75 * args.matchmaking_s,
    )
    # The mailbox's loop runs all the time in its own thread: a peer that has finished its part must
    # keep flushing buffered writes and serving streams while the others finish theirs.
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def wait(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    p2p = wait(dht.replicate_p2p())
    box = Mailbox(p2p, PROTOCOL, TransportConfig(timeout_s=args.timeout))
    wait(box.start())
    names: dict[str, str] = {}  # peer index (as a string) -> base58 peer id
    reply(event="up", peer_id=p2p.peer_id.to_base58(), maddrs=[str(m) for m in dht.get_visible_maddrs()])
    control = None
    cfg = AllReduceConfig(chunk_elements=args.chunk, timeout_s=args.timeout)

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "connect":
                names = {str(k): v["peer_id"] for k, v in enumerate(cmd["peers"])}
                for k, v in enumerate(cmd["peers"]):
                    if k != me:
                        wait(
                            p2p._client.connect(
                                PeerID.from_base58(v["peer_id"]),
                                [Multiaddr(m.split("/p2p/")[0]) for m in v["maddrs"]],
                            )
                        )
                reply(event="ok")
            elif op == "hm_match":
                averager.bandwidth = cmd["bandwidth"]  # read in this process by step()
                with averager.get_tensors() as tensors:
                    tensors[0].copy_(x)
                t0 = time.perf_counter()
                control = averager.step(wait=False, require_trigger=True, timeout=cmd["timeout"])
                while not control.done() and control.stage != AveragingStage.AWAITING_TRIGGER:
                    time.sleep(0.002)
                if control.done():
                    control.result()  # raises the matchmaking error
                reply(event="matched", s=time.perf_counter() - t0)
            elif op == "hm_go":
                assert control is not None
                t0 = time.perf_counter()
                control.allow_allreduce()
                control.result(timeout=cmd["timeout"])
                dt = time.perf_counter() - t0
                with averager.get_tensors() as tensors:
                    e = err(tensors[0])
                control = None
                reply(event="done", s=dt, err=e)
            elif op in ("tree", "ring"):
                if op == "tree":
                    sched = cmd["schedule"]
                    schedule = AllReduceSchedule(
                        tuple(names[p] for p in sched["peers"]),
                        tuple(
                            TreeSpec(
                                names[t["root"]],
                                {names[c]: (None if p is None else names[p]) for c, p in t["parent"].items()},
                                t["share"],
                            )
                            for t in sched["trees"]
                        ),
                    )
                    coro = tree_allreduce(box, schedule, x, cmd["round"], cfg)
                else:
                    order = tuple(names[str(i)] for i in cmd["order"])
                    coro = ring_allreduce(box, order, x, cmd["round"], cfg)
                t0 = time.perf_counter()
                out = wait(coro)
                dt = time.perf_counter() - t0
                reply(event="done", s=dt, err=err(out))
            elif op == "quit":
                break
            else:
                reply(event="error", error=f"unknown op {op}")
        except Exception as e:  # report and keep serving: the driver decides
            reply(event="error", error=f"{type(e).__name__}: {e}")
    with contextlib.suppress(Exception):
        wait(asyncio.wait_for(box.close(), 5.0))
    averager.shutdown()
    dht.shutdown()
    reply(event="bye")
    os._exit(0)  # skip interpreter teardown of the still-running loop thread
