"""Prometheus text for a peer (its own ``/metrics``) and for a swarm (the dashboard's ``/metrics``).

Built fresh at each scrape from the messages already at hand (a peer's snapshot, the ``SwarmView``), in
a registry of its own, so nothing here keeps state or touches the process-wide default registry. Names
follow Prometheus conventions: ``_total`` for counters, base units (seconds, bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import get_args

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from potluck.protocol.telemetry import PeerMetrics, PeerState, PeerStatus
from potluck.telemetry.aggregate import SwarmView

STATES: tuple[str, ...] = get_args(PeerState)
PARTS = ("compute", "send", "recv", "allreduce", "idle")


def _peer_families(
    rows: Iterable[tuple[dict[str, str], PeerStatus | None, PeerMetrics | None, str]],
) -> Iterator[Metric]:
    """One family per quantity, a sample per peer (``labels`` tells them apart on the swarm page)."""
    rows = list(rows)
    keys = sorted({k for labels, *_ in rows for k in labels})
    fam: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "state": GaugeMetricFamily(
            "potluck_peer_state", "1 for the peer's current state", labels=[*keys, "state"]
        ),
        "step": GaugeMetricFamily("potluck_peer_step", "Steps this peer's stage has done", labels=keys),
        "loss": GaugeMetricFamily("potluck_peer_loss", "Loss of the peer's newest step", labels=keys),
        "tps": GaugeMetricFamily(
            "potluck_peer_tokens_per_second", "The swarm's tokens/s as this peer sees it", labels=keys
        ),
        "part": GaugeMetricFamily(
            "potluck_peer_step_seconds", "Seconds of the newest step, by part", labels=[*keys, "part"]
        ),
        "sent": CounterMetricFamily("potluck_peer_sent_bytes", "Bytes sent since joining", labels=keys),
        "recv": CounterMetricFamily(
            "potluck_peer_received_bytes", "Bytes received since joining", labels=keys
        ),
        "steps": CounterMetricFamily(
            "potluck_peer_contributed_steps", "Committed steps it took part in", labels=keys
        ),
        "tokens": CounterMetricFamily(
            "potluck_peer_contributed_tokens", "Tokens of its share of those steps", labels=keys
        ),
        "flops": CounterMetricFamily(
            "potluck_peer_contributed_flops", "Estimated FLOPs it computed", labels=keys
        ),
        "mem": GaugeMetricFamily(
            "potluck_peer_memory_bytes", "Resident memory of the peer process", labels=keys
        ),
        "ratio": GaugeMetricFamily(
            "potluck_peer_codec_ratio", "fp32 bytes per wire byte", labels=[*keys, "kind"]
        ),
        "link": GaugeMetricFamily(
            "potluck_peer_link_megabytes_per_second", "Measured goodput to a peer", labels=[*keys, "dst"]
        ),
        "rtt": GaugeMetricFamily(
            "potluck_peer_link_rtt_seconds", "Measured round trip to a peer", labels=[*keys, "dst"]
        ),
    }
    for labels, status, metrics, state in rows:
        values = [labels.get(k, "") for k in keys]
        for s in STATES:
            fam["state"].add_metric([*values, s], 1.0 if s == state else 0.0)
        if status is not None:
            fam["step"].add_metric(values, float(status.step))
        if metrics is None:
            continue
        if metrics.loss is not None:
            fam["loss"].add_metric(values, metrics.loss)
        fam["tps"].add_metric(values, metrics.tokens_per_s)
        for part in PARTS:
            fam["part"].add_metric([*values, part], getattr(metrics.timing, part))
        fam["sent"].add_metric(values, float(metrics.bytes_sent))
        fam["recv"].add_metric(values, float(metrics.bytes_received))
        fam["steps"].add_metric(values, float(metrics.steps_contributed))
        fam["tokens"].add_metric(values, float(metrics.tokens_contributed))
        fam["flops"].add_metric(values, metrics.flops_contributed)
        fam["mem"].add_metric(values, float(metrics.memory_bytes))
        for kind, ratio in metrics.codec_ratio.items():
            fam["ratio"].add_metric([*values, kind], ratio)
        for dst, link in metrics.links.items():
            fam["link"].add_metric([*values, dst], link.mb_s)
            fam["rtt"].add_metric([*values, dst], link.rtt_ms / 1000.0)
    yield from fam.values()


class _Once(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _render(families: Iterable[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once(list(families)))
    return generate_latest(registry)


def peer_metrics_text(status: PeerStatus, metrics: PeerMetrics) -> bytes:
    """A peer's own ``/metrics``."""
    return _render(_peer_families([({}, status, metrics, status.state)]))


def swarm_metrics_text(view: SwarmView, now: float) -> bytes:
    """The swarm's ``/metrics``: the job, the plan, every shown peer (label ``peer``), the telemetry."""
    c = view.coordinator
    job = GaugeMetricFamily("potluck_job_step", "Steps the whole swarm has completed", labels=["job"])
    steps = GaugeMetricFamily("potluck_job_steps", "The job's last step", labels=["job"])
    loss = GaugeMetricFamily("potluck_job_loss", "Loss of the newest step", labels=["job"])
    tps = GaugeMetricFamily("potluck_job_tokens_per_second", "The swarm's tokens per second", labels=["job"])
    eta = GaugeMetricFamily("potluck_job_eta_seconds", "Seconds to the job's last step", labels=["job"])
    epoch = GaugeMetricFamily("potluck_plan_epoch", "The plan epoch the swarm follows", labels=["job"])
    placed = GaugeMetricFamily("potluck_plan_peers", "Peers the plan places", labels=["job"])
    if c is not None:
        job.add_metric([c.job], float(c.step))
        steps.add_metric([c.job], float(c.steps))
        if c.loss is not None:
            loss.add_metric([c.job], c.loss)
        tps.add_metric([c.job], c.tokens_per_s)
        if c.eta_s is not None:
            eta.add_metric([c.job], c.eta_s)
        if c.epoch is not None:
            epoch.add_metric([c.job], float(c.epoch))
        placed.add_metric([c.job], float(sum(len(st.peers) for st in c.stages)))
    counts = GaugeMetricFamily("potluck_swarm_peers", "Peers shown, by state", labels=["state"])
    states = [view.peer_state(p, now) for p in view.peers]
    for s in (*STATES, "unknown"):
        if s in STATES or s in states:
            counts.add_metric([s], float(states.count(s)))
    messages = CounterMetricFamily("potluck_telemetry_messages", "Telemetry messages taken")
    messages.add_metric([], float(view.messages))
    rejected = CounterMetricFamily(
        "potluck_telemetry_rejected", "Telemetry messages refused (forged, malformed)"
    )
    rejected.add_metric([], float(view.rejected))
    rows = [
        ({"peer": p}, e.status, e.metrics, view.peer_state(p, now)) for p, e in sorted(view.peers.items())
    ]
    return _render(
        [job, steps, loss, tps, eta, epoch, placed, counts, messages, rejected, *_peer_families(rows)]
    )
