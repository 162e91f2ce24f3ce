"""What the planner believes about a peer's speed: its claim is a prior, its measured steps the truth.

A heartbeat's TFLOP/s is self-reported, and a peer that overstates it wins layers it cannot run (one
claiming 10,000 TFLOP/s on a CPU was given 6 of 8 layers). So, before a peer has been measured on the
job, its claim counts for at most:

- what its device could plausibly do (``plausible_tflops``: a CPU core does not exceed 0.2 TFLOP/s fp32,
  no accelerator 2,500 TFLOP/s bf16), and
- ``claim_cap`` x the median claim of the peers being planned (``TrustSpec.claim_cap``; 0 turns it off),
  so that one liar among n honest peers wins at most ``cap / (n + cap)`` of the compute;

and once measured (``calibrated_tflops``: its stage's FLOPs over the compute seconds it reported per
step) the measurement replaces the claim. A peer measured at less than ``1 / OVERCLAIM`` of its claim is
*overclaimed*: the coordinator says so, and its claims are not believed again in this job.

Link reports are claims too, and a peer that overstates its links draws traffic it cannot carry. The
other end of a probe times it as well (``LinkReport.inbound``), so ``confirmed_links`` believes a
measured bandwidth a -> b only up to ``INBOUND_SLACK`` x what b saw arrive from a's probe; a claim b never
saw (a made-up measurement, or b's report is not out yet) counts for at most the median confirmed link;
and a pair's round trip is the larger of what its two ends measured. A hostile receiver can only make
links *to itself* look slow, which steers work away from it. A declared access link (``LinkReport.access``)
is believed up to ``INBOUND_SLACK`` x the fastest confirmed link in its direction once there is one (an
upload is what the peer's sends showed; a download what others' probes of it showed); understating it
only moves work away from the peer. Pure functions; the coordinator keeps the state.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from potluck.coordinator.placement.netmodel import AccessCapacity
from potluck.protocol.records import Hardware, LinkReport, LinkSample

CPU_CORE_TFLOPS = 0.2  # fp32 with AVX-512 FMA at ~3 GHz: 2 x 16 x 2 x 3e9 = 0.19 TFLOP/s per core
ACCELERATOR_TFLOPS = 2500.0  # beyond any single device's dense bf16 today (an H200: ~990)
OVERCLAIM = 4.0  # measured below claim / this: the claim was false
# The receiver times a probe from its first frame's arrival, so it sees a little more goodput than the
# sender, and links vary between the probe and the report: an honest claim stays within this x it.
INBOUND_SLACK = 1.5


def tflops_ceiling(hw: Hardware) -> float:
    """What this kind of device cannot exceed, claimed or measured."""
    return CPU_CORE_TFLOPS * hw.cpu_cores if hw.device_kind == "cpu" else ACCELERATOR_TFLOPS


def plausible_tflops(hw: Hardware) -> float:
    """The claimed TFLOP/s the planner may use for this hardware, before any measurement."""
    claim = hw.tflops_bf16 if hw.device_kind == "cuda" else hw.tflops_fp32
    return max(min(claim, tflops_ceiling(hw)), 1e-6)


def believed_tflops(
    claims: Mapping[str, float],
    measured: Mapping[str, float],
    cap: float,
    distrusted: frozenset[str] = frozenset(),
    ceilings: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Per peer: its measured TFLOP/s where there is one, else its claim capped at ``cap`` x the median
    claim (``cap`` <= 0: uncapped). A distrusted peer without a measurement counts as the median. A
    measurement comes from the compute seconds the peer itself reports, so it is held to its device's
    ``ceilings`` too (a CPU reporting impossibly short steps is believed at its cores' best)."""
    out: dict[str, float] = {}
    median = statistics.median(claims.values()) if claims else 0.0
    for peer, claim in claims.items():
        if measured.get(peer, 0.0) > 0:
            out[peer] = min(measured[peer], (ceilings or {}).get(peer, float("inf")))
        elif peer in distrusted:
            out[peer] = min(claim, median)
        else:
            out[peer] = min(claim, cap * median) if cap > 0 else claim
    return out


def overclaimed(claims: Mapping[str, float], measured: Mapping[str, float]) -> list[str]:
    """Peers whose measured speed is below ``1 / OVERCLAIM`` of what they claim, sorted."""
    return sorted(p for p, m in measured.items() if m > 0 and p in claims and m * OVERCLAIM < claims[p])


def confirmed_links(reports: Mapping[str, LinkReport]) -> dict[str, LinkReport]:
    """Each peer's outbound links as the planner may believe them (see the module's text)."""
    seen = {(s.dst, r.peer_id): s.bandwidth_gbps for r in reports.values() for s in r.inbound}
    rtts = {(r.peer_id, s.dst): s.rtt_ms for r in reports.values() for s in r.links}
    # Either end may say the connection ran through a relay (each sees its own connection's address).
    relayed_in = {(s.dst, r.peer_id) for r in reports.values() for s in r.inbound if s.relayed}
    confirmed = [
        min(s.bandwidth_gbps, INBOUND_SLACK * seen[(r.peer_id, s.dst)])
        for r in reports.values()
        for s in r.links
        if (r.peer_id, s.dst) in seen
    ]
    median = statistics.median(confirmed) if confirmed else None
    out: dict[str, LinkReport] = {}
    for peer, report in reports.items():
        links = []
        for s in report.links:
            saw = seen.get((peer, s.dst))
            if saw is not None:
                bandwidth = min(s.bandwidth_gbps, INBOUND_SLACK * saw)
            else:
                bandwidth = s.bandwidth_gbps if median is None else min(s.bandwidth_gbps, median)
            rtt = max(s.rtt_ms, rtts.get((s.dst, peer), 0.0))
            relayed = s.relayed or (peer, s.dst) in relayed_in
            links.append(LinkSample(dst=s.dst, rtt_ms=rtt, bandwidth_gbps=bandwidth, relayed=relayed))
        out[peer] = report.model_copy(update={"links": links})
    return out


def believed_access(confirmed: Mapping[str, LinkReport]) -> dict[str, AccessCapacity]:
    """Each reporting peer's declared access link, bounded by its confirmed links (``confirmed_links``'
    output): no peer is believed to upload faster than ``INBOUND_SLACK`` x its fastest confirmed send,
    nor to download faster than that x the fastest confirmed link towards it."""
    fastest_in: dict[str, float] = {}
    for report in confirmed.values():
        for s in report.links:
            fastest_in[s.dst] = max(fastest_in.get(s.dst, 0.0), s.bandwidth_gbps)
    out = {}
    for peer, report in confirmed.items():
        up, down = report.access.upload_gbps, report.access.download_gbps
        fastest_out = max((s.bandwidth_gbps for s in report.links), default=0.0)
        if up is not None and fastest_out > 0:
            up = min(up, INBOUND_SLACK * fastest_out)
        if down is not None and fastest_in.get(peer, 0.0) > 0:
            down = min(down, INBOUND_SLACK * fastest_in[peer])
        if up is not None or down is not None:
            out[peer] = AccessCapacity(upload_gbps=up, download_gbps=down)
    return out
