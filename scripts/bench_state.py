"""Stage state hand-off over the swarm: MB/s of a fetch from 1 and 2 live holders on loopback.

Real p2pd daemons in one process (127.0.0.1), each under its own Ed25519 identity; the holders serve a
stage's tensors (fp32 with random mantissas, as trained weights are: zstd barely shrinks them) through
``peer.state.transfer.StateServer``; a third daemon pulls them with ``PeerSource`` (signed manifest,
hash-checked chunks, chunks spread over the holders) and checks every byte. The first fetch of a range
also has the holders build the manifest (pack + SHA-256 per chunk); repeats reuse it. Each fetch's
growth of this process's resident memory over the state's size is ``rss_ratio`` (repeats: the
fetcher's alone; ``fetch_rss_ratio``, their median: 1.0 is the state in memory once).

    python scripts/bench_state.py [--mb 50] [--repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's potluck

from potluck.net.streams import Streams
from potluck.peer.state.source import Holder, PeerSource
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.jobspec import ModelSpec
from potluck.testbed.harness.p2p import keyed_group
from potluck.transfer.manifest import StateWant
from potluck.transfer.server import StateServer, TransferConfig
from potluck.transfer.snapshot import StageState

SWARM = "bench-state"
RSS = psutil.Process()
MODEL = ModelSpec(n_layers=4, d_model=128, n_heads=2, vocab_size=256, seq_len=16)


def stage_state(mb: float) -> StageState:
    """Layers [0, 2) of a job whose two layer tensors hold ``mb`` MB of fp32 between them."""
    meta = StageMeta(
        job="bench",
        step=1,
        stage=0,
        n_stages=2,
        first_layer=0,
        last_layer=2,
        model=MODEL,
        seed=0,
        tokenizer=None,
        epoch=1,
    )
    per_layer = int(mb * 1e6 / 4 / 2)  # fp32 elements per layer tensor
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "model.embed.weight": torch.randn(256, 128, generator=gen),
        "model.layers.0.w": torch.randn(per_layer, generator=gen),
        "model.layers.1.w": torch.randn(per_layer, generator=gen),
    }
    return StageState(meta, tensors)


async def run(mb: float, repeats: int) -> list[dict[str, float]]:
    state = stage_state(mb)
    total = sum(t.numel() * t.element_size() for t in state.tensors.values())
    cfg = TransferConfig(timeout_s=30)
    rows = []
    with tempfile.TemporaryDirectory() as keys:
        async with keyed_group(3, Path(keys)) as nodes:
            servers = []
            for p2p, identity in nodes[:2]:
                server = StateServer(Streams(p2p), SWARM, identity, cfg)
                server.offer(state)
                await server.start()
                servers.append(server)
            want = StateWant("bench", MODEL, 0, 1, 0, 2)
            for holders in (1, 2):
                ids = [Holder(p2p.peer_id.to_base58(), 0, 2) for p2p, _ in nodes[:holders]]
                source = PeerSource(Streams(nodes[2][0]), SWARM, ids, cfg)
                for attempt in range(repeats):
                    gc.collect()
                    before, peak = RSS.memory_info().rss, [0]

                    async def watch(peak: list[int] = peak) -> None:
                        while True:
                            peak[0] = max(peak[0], RSS.memory_info().rss)
                            await asyncio.sleep(0.01)

                    watching = asyncio.create_task(watch())
                    t0 = time.perf_counter()
                    got = await source.fetch(want, 300.0)
                    seconds = time.perf_counter() - t0
                    watching.cancel()
                    grown = max(peak[0], RSS.memory_info().rss) - before
                    for name, tensor in state.tensors.items():
                        if not torch.equal(got.tensors[name], tensor):
                            raise SystemExit(f"{name} arrived different from what was served")
                    rows.append(
                        {
                            "holders": holders,
                            "attempt": attempt,
                            "mb": total / 1e6,
                            "seconds": seconds,
                            "mb_s": total / 1e6 / seconds,
                            # the first fetch of a range also has the holders (this process) pack it
                            "rss_ratio": grown / total,
                        }
                    )
                    del got
            for server in servers:
                await server.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=50.0, help="state size, MB")
    ap.add_argument("--repeats", type=int, default=2, help="fetches per holder count")
    ap.add_argument("--json", action="store_true", help="end with one JSON object")
    args = ap.parse_args()
    rows = asyncio.run(run(args.mb, args.repeats))
    for r in rows:
        print(
            f"{r['holders']} holder(s), fetch {r['attempt'] + 1}: {r['mb']:.1f} MB in "
            f"{r['seconds']:.2f} s = {r['mb_s']:.0f} MB/s"
        )
    if args.json:
        summary: dict[str, float] = {
            f"mb_s_{h}_holders": statistics.median(r["mb_s"] for r in rows if r["holders"] == h)
            for h in (1, 2)
        }
        repeat = [r["rss_ratio"] for r in rows if r["attempt"] > 0]
        if repeat:  # the fetcher's memory alone: the state in memory once is 1.0
            summary["fetch_rss_ratio"] = statistics.median(repeat)
        print(json.dumps({"rows": rows, **summary}))


if __name__ == "__main__":
    main()
