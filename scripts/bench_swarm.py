#!/usr/bin/env python3
"""Foundation benchmarks: how fast a local swarm forms, how fast status reads it, how fast peers leave,
and how fast records are sealed and verified.

    python scripts/bench_swarm.py [--peers 3 8] [--out bench-out/swarm.json]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import tempfile
import time
from pathlib import Path

from hivemind.utils.serializer import MSGPackSerializer

from potluck.protocol.envelope import TrustPolicy, key_id_bytes, seal, subkey_bytes, verify
from potluck.protocol.identity import Identity
from potluck.protocol.records import Hardware, PeerRecord
from potluck.testbed.localswarm import LocalSwarm

ROOT = Path(__file__).resolve().parents[1]


def bench_records(n: int = 2000) -> dict[str, float]:
    peer, coord = Identity.generate(), Identity.generate()
    policy = TrustPolicy("bench", coord.public_key)
    hw = Hardware(
        device_kind="cpu",
        device_name="x",
        memory_total_bytes=1 << 30,
        memory_free_bytes=1 << 29,
        cpu_cores=2,
        tflops_fp32=0.1,
        tflops_bf16=0.2,
    )
    now = time.time()
    rec = PeerRecord(peer_id=peer.peer_id, hardware=hw, maddrs=["/ip4/127.0.0.1/tcp/1"], issued_at=now)
    t = time.perf_counter()
    values = [seal(peer, "bench", "peers", rec, now + 30, peer.peer_id) for _ in range(n)]
    seal_s = time.perf_counter() - t
    key, sk = key_id_bytes("bench", "peers"), subkey_bytes(peer.peer_id)
    stored = [bytes(MSGPackSerializer.dumps(v)) for v in values]
    t = time.perf_counter()
    for v in stored:
        verify(policy, key, sk, v, now + 30, now)
    verify_s = time.perf_counter() - t
    return {"seal_per_s": n / seal_s, "verify_per_s": n / verify_s, "record_bytes": len(stored[0])}


def bench_swarm(n_peers: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        swarm = LocalSwarm(
            Path(tmp),
            ROOT / "examples" / "tiny.toml",
            swarm_id="bench",
            peer_args=("--probe-seconds", "0.2"),
            coordinator_args=("--membership-only",),
        )
        with swarm:
            t0 = time.monotonic()
            swarm.start_coordinator()
            coord_s = time.monotonic() - t0
            for i in range(n_peers):
                swarm.start_peer(f"peer{i}")
            swarm.wait_for(lambda ps: len(ps) >= n_peers, timeout_s=180, poll_s=0.25)
            all_visible_s = time.monotonic() - t0
            reads = []
            for _ in range(5):
                t = time.monotonic()
                assert len(swarm.live_peers()) == n_peers
                reads.append(time.monotonic() - t)
            t = time.monotonic()
            exit_s = swarm.stop("peer0", signal.SIGTERM)
            swarm.wait_for(lambda ps: len(ps) == n_peers - 1, timeout_s=30, poll_s=0.2)
            gone_s = time.monotonic() - t
    return {
        "peers": n_peers,
        "coordinator_invite_s": coord_s,
        "all_visible_s": all_visible_s,
        "status_read_median_s": statistics.median(reads),
        "sigterm_exit_s": exit_s,
        "sigterm_gone_from_status_s": gone_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=int, nargs="+", default=[3, 8])
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "swarm.json")
    args = ap.parse_args()
    results = {"records": bench_records(), "swarms": [bench_swarm(n) for n in args.peers]}
    r = results["records"]
    print(
        f"records: seal {r['seal_per_s']:.0f}/s, verify {r['verify_per_s']:.0f}/s, {r['record_bytes']} B each"
    )
    print(
        f"{'peers':>5} {'invite s':>9} {'all visible s':>14} {'status read s':>14}"
        f" {'exit s':>7} {'gone s':>7}"
    )
    for s in results["swarms"]:
        print(
            f"{s['peers']:>5} {s['coordinator_invite_s']:>9.2f} {s['all_visible_s']:>14.2f} "
            f"{s['status_read_median_s']:>14.2f} {s['sigterm_exit_s']:>7.2f}"
            f" {s['sigterm_gone_from_status_s']:>7.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
