"""Serving state beside training on a home uplink: what the serve share buys (issue 38, item 1).

Three network namespaces on a bridge (``testbed.netem.Netlab``): A trains and serves, B receives A's
training messages, C fetches state from A. A's uplink is capped by a kernel tbf (``--up-mbit``, 20 by
default, its queue 100 ms, as a home router's). A sends B one 64 KiB training message every 100 ms
(5.2 Mbit/s: a pipeline's activations) and, in the rows with a fetch, sends C ``--state-mb`` MiB of
state in 1 MiB chunk frames through the state server's own write path (``net.pace.write_paced``)
at the row's share of the uplink. B timestamps each training message's arrival (the namespaces share
one monotonic clock), so a message's latency includes A's queue and the link; a row's figures are
over the messages sent while the fetch ran.

Rows: no fetch (the training traffic alone); share 1 (the state server before issue 38: unpaced);
share 0.5 (``TransferConfig.serve_share``'s default). What the pacer is told as the uplink is the
shaped rate, what a peer that declared its uplink, or measured it, would know. Raw TCP between the
namespaces, not p2pd: the bench isolates the uplink queue, where the two flows meet.

Needs root.

    sudo .venv/bin/python scripts/bench_serve_share.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's potluck

from potluck.net.pace import Throttle, write_paced
from potluck.protocol.wire import Frame, MsgType, read_frame, write_frame
from potluck.testbed.netem import Netlab, require_root

TRAIN_PORT, STATE_PORT = 5101, 5102
MESSAGE_BYTES = 64 << 10
EVERY_S = 0.1  # one training message every 100 ms
CHUNK = 1 << 20
STAMP = struct.Struct("<d")


async def receiver(port: int, seconds: float) -> dict[str, Any]:
    """B or C: accept one connection; per frame, its latency from the stamp at its head, and bytes."""
    got: dict[str, Any] = {"sent_at": [], "latency_s": [], "bytes": 0, "first": None, "last": None}
    done = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                frame = await read_frame(reader, seconds + 30, expect={MsgType.BULK})
                now = time.monotonic()
                (sent_at,) = STAMP.unpack_from(frame.payload)
                got["sent_at"].append(sent_at)
                got["latency_s"].append(now - sent_at)
                got["bytes"] += len(frame.payload)
                got["first"] = got["first"] or now
                got["last"] = now
        except Exception:  # the sender closed: done
            pass
        finally:
            writer.close()
            done.set()

    server = await asyncio.start_server(handle, "0.0.0.0", port)
    async with server:
        await asyncio.wait_for(done.wait(), seconds + 60)
    return got


async def sender(
    addrs: list[str], seconds: float, state_mb: float, share: float | None, up_mbit: float
) -> dict:
    """A: training messages to B for ``seconds``; with ``share``, ``state_mb`` MiB to C meanwhile."""
    _, to_b = await asyncio.open_connection(addrs[1], TRAIN_PORT)
    window: list[float] = []  # the fetch's start and end, on the namespaces' shared monotonic clock

    async def training() -> None:
        start = time.monotonic()
        for k in range(int(seconds / EVERY_S)):
            await asyncio.sleep(max(0.0, start + k * EVERY_S - time.monotonic()))
            payload = STAMP.pack(time.monotonic()) + bytes(MESSAGE_BYTES - STAMP.size)
            await write_frame(to_b, Frame(MsgType.BULK, payload), 60.0)

    async def state() -> None:
        _, to_c = await asyncio.open_connection(addrs[2], STATE_PORT)
        pacer = Throttle(lambda: share * up_mbit * 1e6 / 8 if share is not None and share < 1 else None)
        await asyncio.sleep(1.0)  # the training flow first, as on a peer that trains
        t0 = time.monotonic()
        for _ in range(int(state_mb)):
            frame = Frame(MsgType.BULK, STAMP.pack(time.monotonic()) + bytes(CHUNK - STAMP.size))
            await write_paced(to_c, frame, 60.0, pacer)
        window[:] = [t0, time.monotonic()]
        to_c.close()

    jobs = [training()] + ([state()] if share is not None else [])
    await asyncio.gather(*jobs)
    to_b.close()
    return {"window": window}


def inner(args: argparse.Namespace) -> None:
    if args.role == "sender":
        out = asyncio.run(
            sender(args.addrs.split(","), args.seconds, args.state_mb, args.share, args.up_mbit)
        )
    else:
        out = asyncio.run(receiver(TRAIN_PORT if args.role == "train" else STATE_PORT, args.seconds))
    print(json.dumps(out))


def row(lab: Netlab, share: float | None, args: argparse.Namespace) -> dict[str, Any]:
    me = [sys.executable, str(Path(__file__).resolve()), "--seconds", str(args.seconds)]
    recv_b = subprocess.Popen(
        [*lab.exec_prefix(1), *me, "--role", "train"], stdout=subprocess.PIPE, text=True
    )
    recv_c = subprocess.Popen(
        [*lab.exec_prefix(2), *me, "--role", "state"], stdout=subprocess.PIPE, text=True
    )
    time.sleep(1.0)  # both listening
    cmd = [*me, "--role", "sender", "--addrs", ",".join(lab.addrs), "--state-mb", str(args.state_mb)]
    cmd += ["--up-mbit", str(args.up_mbit)] + (["--share", str(share)] if share is not None else [])
    procs = [recv_b, recv_c]
    try:
        sent = json.loads(
            subprocess.run(
                [*lab.exec_prefix(0), *cmd],
                capture_output=True,
                text=True,
                timeout=args.seconds + 120,
                check=True,
            ).stdout
        )
        b = json.loads(recv_b.communicate(timeout=60)[0])
        if share is None:
            recv_c.send_signal(signal.SIGTERM)  # nobody fetched: ours, by PID
            recv_c.wait(timeout=10)
        else:
            recv_c.communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    start, end = sent["window"] or (1.0 + min(b["sent_at"]), max(b["sent_at"]))  # no fetch: after 1 s
    lat = sorted(x for t, x in zip(b["sent_at"], b["latency_s"], strict=True) if start <= t <= end)
    return {
        "share": share,
        "messages": len(lat),  # training messages sent while the fetch ran (no fetch: after its start)
        "latency_ms_p50": round(statistics.median(lat) * 1e3, 1),
        "latency_ms_p90": round(lat[int(0.9 * (len(lat) - 1))] * 1e3, 1),
        "latency_ms_max": round(lat[-1] * 1e3, 1),
        "state_mb_s": round(args.state_mb * CHUNK / 1e6 / (end - start), 2) if sent["window"] else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--up-mbit", type=float, default=20.0, help="A's uplink, Mbit/s")
    ap.add_argument("--state-mb", type=float, default=16.0, help="state fetched from A, MiB")
    ap.add_argument("--seconds", type=float, default=20.0, help="training traffic per row")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    ap.add_argument("--role", choices=("sender", "train", "state"), help=argparse.SUPPRESS)
    ap.add_argument("--addrs", help=argparse.SUPPRESS)
    ap.add_argument("--share", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role is not None:
        inner(args)
        return 0
    require_root("bench_serve_share")
    rows = []
    with Netlab(3) as lab:
        lab.shape([args.up_mbit, None, None])
        for share in (None, 1.0, 0.5):
            rows.append(row(lab, share, args))
            print(rows[-1], file=sys.stderr)
    if args.json:
        print(json.dumps({"up_mbit": args.up_mbit, "state_mb": args.state_mb, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
