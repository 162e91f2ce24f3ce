"""The network model: full latency and bandwidth matrices from partial, measured link reports.

Peers measure only a few others (O(log N) or a fixed number). Measured pairs are used as measured; for the
rest, latency comes from network coordinates fitted to the measured RTTs (a batch form of Vivaldi: points
in a low-dimensional space plus a per-peer "height" for the access link) and bandwidth from each peer's
access capacity (upload/download) when known, else from the peer's measured links.

Units: latency is one-way milliseconds (RTT / 2); bandwidth is Gbit/s, row = sender, column = receiver.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from potluck.coordinator.errors import NetModelError


@dataclass(frozen=True)
class LinkMeasurement:
    """One measured directed pair, as a peer's link report gives it."""

    src: Hashable
    dst: Hashable
    rtt_ms: float
    bandwidth_gbps: float


@dataclass(frozen=True)
class AccessCapacity:
    """A peer's own access link (measured or declared), Gbit/s; None where unknown."""

    upload_gbps: float | None = None
    download_gbps: float | None = None


@dataclass(frozen=True)
class NetModel:
    """Full N x N link matrices plus which entries were measured (the rest are estimates)."""

    latency_ms: np.ndarray
    bandwidth_gbps: np.ndarray
    measured: np.ndarray
    upload_gbps: np.ndarray  # per peer; inf where unknown
    download_gbps: np.ndarray

    @property
    def n(self) -> int:
        return int(self.latency_ms.shape[0])

    def subset(self, idx: Sequence[int]) -> NetModel:
        """The model restricted to peers `idx`, renumbered 0..len(idx)-1."""
        ix = np.asarray(idx, dtype=np.int64)
        grid = np.ix_(ix, ix)
        return NetModel(
            self.latency_ms[grid],
            self.bandwidth_gbps[grid],
            self.measured[grid],
            self.upload_gbps[ix],
            self.download_gbps[ix],
        )


def slow_pairs(model: NetModel, pairs: Iterable[tuple[int, int]], factor: float) -> NetModel:
    """``model`` with both directions of each pair ``factor`` times slower (relayed links: see
    ``coordinator/job/plan.py``), so every objective keeps bulk traffic off them where it can."""
    if factor < 1.0:
        raise NetModelError(f"a slow-down factor must be >= 1, not {factor}")
    bw = model.bandwidth_gbps.copy()
    for i, j in pairs:
        if i != j:
            bw[i, j] /= factor
            bw[j, i] /= factor
    return NetModel(model.latency_ms, bw, model.measured, model.upload_gbps, model.download_gbps)


def from_matrices(
    latency_ms: Sequence[Sequence[float]] | np.ndarray,
    bandwidth_gbps: Sequence[Sequence[float]] | np.ndarray,
    upload_gbps: Sequence[float] | None = None,
    download_gbps: Sequence[float] | None = None,
) -> NetModel:
    """A model where every pair is given (a scenario file, a lab measurement)."""
    lat = np.asarray(latency_ms, dtype=np.float64)
    bw = np.asarray(bandwidth_gbps, dtype=np.float64)
    n = lat.shape[0]
    if lat.shape != (n, n) or bw.shape != (n, n):
        raise NetModelError(f"link matrices must be square and of equal shape; got {lat.shape}, {bw.shape}")
    off = ~np.eye(n, dtype=bool)
    if (bw[off] <= 0).any() or (lat < 0).any() or not np.isfinite(lat).all():
        raise NetModelError("bandwidths must be > 0 and latencies finite and >= 0")
    up = np.full(n, np.inf) if upload_gbps is None else np.asarray(upload_gbps, dtype=np.float64)
    down = np.full(n, np.inf) if download_gbps is None else np.asarray(download_gbps, dtype=np.float64)
    return NetModel(lat, bw, np.ones((n, n), dtype=bool), up, down)


def fit_coordinates(
    n: int,
    src: np.ndarray,
    dst: np.ndarray,
    latency_ms: np.ndarray,
    dims: int = 3,
    iters: int = 400,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Fit positions x (n x dims) and heights h (n) so that |x_i - x_j| + h_i + h_j ~ latency.

    Batch Vivaldi: every iteration moves each peer by the mean spring force of its measured pairs,
    with a step that shrinks over time. Relative error weighting so short links matter as much as long
    ones. Deterministic for a seed.
    """
    rng = np.random.default_rng(seed)
    scale = float(np.median(latency_ms)) if len(latency_ms) else 1.0
    x = rng.normal(0.0, scale / 4 + 1e-9, size=(n, dims))
    h = np.full(n, 0.05 * scale)
    degree = np.bincount(np.concatenate([src, dst]), minlength=n).astype(np.float64)
    degree[degree == 0] = 1.0
    weight = 1.0 / np.maximum(latency_ms, 1e-3)
    for it in range(iters):
        step = 0.5 * (1.0 - it / iters) + 0.02
        diff = x[src] - x[dst]
        dist = np.linalg.norm(diff, axis=1)
        unit = diff / np.maximum(dist, 1e-9)[:, None]
        err = latency_ms - (dist + h[src] + h[dst])  # > 0: pred too short, push apart
        force = (err * weight * np.minimum(latency_ms, scale * 10))[:, None] * unit
        move = np.zeros_like(x)
        np.add.at(move, src, force)
        np.add.at(move, dst, -force)
        x += step * move / degree[:, None]
        dh = np.zeros(n)
        np.add.at(dh, src, err * weight * np.minimum(latency_ms, scale * 10))
        np.add.at(dh, dst, err * weight * np.minimum(latency_ms, scale * 10))
        h = np.maximum(h + 0.5 * step * dh / degree, 0.0)
    return x, h


def _index(peers: Sequence[Hashable]) -> dict[Hashable, int]:
    index = {p: i for i, p in enumerate(peers)}
    if len(index) != len(peers):
        raise NetModelError("peer list has duplicates")
    return index


def build_netmodel(
    peers: Sequence[Hashable],
    measurements: Sequence[LinkMeasurement | tuple[Hashable, Hashable, float, float]],
    capacities: Mapping[Hashable, AccessCapacity] | None = None,
    dims: int = 3,
    seed: int = 0,
) -> NetModel:
    """Full matrices from measured pairs `(src, dst, rtt_ms, bandwidth_gbps)` plus optional capacities.

    Several measurements of one pair keep the median. A pair measured in one direction fills the other
    direction's latency too (RTT is symmetric). Bandwidth is directional (home uplinks are 5-20x slower
    than downlinks): an unmeasured reverse direction is estimated from the two peers' access capacities
    and typical rates in that direction, like any unmeasured pair.
    """
    index = _index(peers)
    n = len(peers)
    caps = capacities or {}
    cap = [caps.get(p) or AccessCapacity() for p in peers]
    up = np.array([c.upload_gbps or np.inf for c in cap], dtype=np.float64)
    down = np.array([c.download_gbps or np.inf for c in cap], dtype=np.float64)
    samples: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for m in measurements:
        rec = m if isinstance(m, LinkMeasurement) else LinkMeasurement(*m)
        if rec.src not in index or rec.dst not in index:
            raise NetModelError(f"link report names an unknown peer: {rec.src!r} -> {rec.dst!r}")
        if rec.rtt_ms < 0 or rec.bandwidth_gbps <= 0:
            raise NetModelError(
                f"bad link report {rec.src!r} -> {rec.dst!r}: {rec.rtt_ms} ms, {rec.bandwidth_gbps} Gbit/s"
            )
        i, j = index[rec.src], index[rec.dst]
        if i != j:
            samples.setdefault((i, j), []).append((rec.rtt_ms / 2.0, rec.bandwidth_gbps))
    lat = np.zeros((n, n))
    bw = np.zeros((n, n))
    measured = np.zeros((n, n), dtype=bool)
    lat_known = np.zeros((n, n), dtype=bool)
    for (i, j), vals in samples.items():
        lat_ij = float(np.median([v[0] for v in vals]))
        bw[i, j] = float(np.median([v[1] for v in vals]))
        measured[i, j] = True
        for a, b in ((i, j), (j, i)):
            lat[a, b] = lat_ij if not lat_known[a, b] else (lat[a, b] + lat_ij) / 2
            lat_known[a, b] = True
    _fill_latency(n, lat, lat_known, dims, seed)
    _fill_bandwidth(n, bw, measured, up, down)
    np.fill_diagonal(lat, 0.0)
    return NetModel(lat, bw, measured, up, down)


def _fill_latency(n: int, lat: np.ndarray, known: np.ndarray, dims: int, seed: int) -> None:
    src, dst = np.nonzero(np.triu(known, 1))
    if len(src) == 0:
        raise NetModelError("no measured links: cannot estimate latencies")
    x, h = fit_coordinates(n, src, dst, lat[src, dst], dims=dims, seed=seed)
    est = np.linalg.norm(x[:, None, :] - x[None, :, :], axis=2) + h[:, None] + h[None, :]
    lat[~known] = est[~known]


def _typical(rates: list[np.ndarray], fallback: np.ndarray | None = None) -> np.ndarray:
    """Median of each peer's rates; peers with none take `fallback` (else the swarm's median)."""
    out = np.array([float(np.median(v)) if len(v) else np.nan for v in rates])
    if fallback is not None:
        out = np.where(np.isfinite(out), out, fallback)
    swarm = float(np.nanmedian(out)) if np.isfinite(out).any() else 1.0
    return np.where(np.isfinite(out), out, swarm)


def _fill_bandwidth(n: int, bw: np.ndarray, known: np.ndarray, up: np.ndarray, down: np.ndarray) -> None:
    # A peer's typical measured rate in a direction stands in for its access capacity where none was
    # reported: its sends for its upload, what it received for its download. A peer measured only one
    # way takes its other-way median (better than the swarm's), and no estimate exceeds a reported cap.
    both = _typical([np.concatenate([bw[i, known[i]], bw[known[:, i], i]]) for i in range(n)])
    sent = _typical([bw[i, known[i]] for i in range(n)], both)
    received = _typical([bw[known[:, i], i] for i in range(n)], both)
    send = np.where(np.isfinite(up), up, sent)
    recv = np.where(np.isfinite(down), down, received)
    est = np.minimum(send[:, None], recv[None, :])
    fill = ~known
    np.fill_diagonal(fill, False)
    bw[fill] = est[fill]
    np.fill_diagonal(bw, np.maximum(bw.max(), 1.0))


@dataclass(frozen=True)
class EstimationError:
    """Relative errors of estimates on held-out measured pairs (|est - true| / true)."""

    held_out: int
    latency_median: float
    latency_p90: float
    bandwidth_median: float
    bandwidth_p90: float


def holdout_error(
    peers: Sequence[Hashable],
    measurements: Sequence[LinkMeasurement | tuple[Hashable, Hashable, float, float]],
    capacities: dict[Hashable, AccessCapacity] | None = None,
    fraction: float = 0.2,
    seed: int = 0,
) -> EstimationError:
    """Hide `fraction` of the measured pairs, rebuild the model, and score its estimates of them."""
    recs = [m if isinstance(m, LinkMeasurement) else LinkMeasurement(*m) for m in measurements]
    rng = np.random.default_rng(seed)
    test = rng.random(len(recs)) < fraction
    train = [r for r, t in zip(recs, test, strict=True) if not t]
    held = [r for r, t in zip(recs, test, strict=True) if t]
    if not held:
        raise NetModelError("no pairs held out; raise `fraction` or give more measurements")
    model = build_netmodel(peers, train, capacities, seed=seed)
    index = _index(peers)
    lat_err, bw_err = [], []
    for r in held:
        i, j = index[r.src], index[r.dst]
        if model.measured[i, j] or model.measured[j, i]:
            continue  # the reverse direction was kept in training: not an estimate
        lat_err.append(abs(model.latency_ms[i, j] - r.rtt_ms / 2) / max(r.rtt_ms / 2, 1e-6))
        bw_err.append(abs(model.bandwidth_gbps[i, j] - r.bandwidth_gbps) / r.bandwidth_gbps)
    if not lat_err:
        raise NetModelError("every held-out pair was measured in the reverse direction")
    return EstimationError(
        len(lat_err),
        float(np.median(lat_err)),
        float(np.quantile(lat_err, 0.9)),
        float(np.median(bw_err)),
        float(np.quantile(bw_err, 0.9)),
    )
