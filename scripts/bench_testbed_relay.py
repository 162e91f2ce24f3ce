"""How much traffic the WAN testbed's Python relay carries, and at what CPU cost (root).

For each rate: build the bundled ``pair-10ms`` scenario (two peers, 20 ms RTT) scaled to that rate,
send one bulk TCP flow 0 -> 1 lasting ``--seconds`` at the rate, and report the rate measured after
slow start (``tcpi_delivered`` x MTU, as ``potluck testbed check`` does) and the relay's CPU time
over the flow, as a share of one core.

    sudo python scripts/bench_testbed_relay.py --rates 10 50 100 200 400 800 [--json]
"""

from __future__ import annotations

import argparse
import json
import time

from potluck.testbed.wan import WanLab, load_spec, sigterm_raises
from potluck.testbed.wan.check import Agents


def one_rate(mbit: float, seconds: float) -> dict[str, float]:
    spec = load_spec("pair-10ms", bandwidth_scale=mbit / 1000.0)
    with sigterm_raises(), WanLab(spec) as lab:
        agents = Agents(lab)
        try:
            cpu0, t0 = lab.relay_cpu_s(), time.monotonic()
            nbytes = int(mbit * 1e6 / 8 * seconds)
            agents.ask(0, {"op": "bulk", "dst": lab.addr(1), "bytes": nbytes, "skip_s": 0.5})
            flow = agents.reply(0, 60 + 5 * seconds)
            cpu1, t1 = lab.relay_cpu_s(), time.monotonic()
        finally:
            agents.close()
    measured = flow["window_segs"] * lab.mtu * 8e-6 / flow["window_s"] if flow["window_s"] > 0 else 0.0
    return {
        "mbps_target": mbit,
        "mbps_measured": round(measured, 2),
        "relay_cpu_pct": round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
        "flow_s": round(t1 - t0, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[10, 50, 100, 200, 400, 800], help="Mbit/s")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each flow at its rate")
    ap.add_argument("--json", action="store_true", help="one JSON line at the end")
    args = ap.parse_args()
    rows = []
    for mbit in args.rates:
        row = one_rate(mbit, args.seconds)
        rows.append(row)
        if not args.json:
            print(
                f"target {row['mbps_target']:7.1f} Mbit/s  measured {row['mbps_measured']:7.1f}  "
                f"relay CPU {row['relay_cpu_pct']:5.1f}% of one core over {row['flow_s']:.2f} s"
            )
    if args.json:
        print(json.dumps({"rates": rows}))


if __name__ == "__main__":
    main()
