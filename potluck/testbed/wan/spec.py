"""What the emulated WAN must look like: a scenario file's links, scaled, and each direction's target.

A scenario (format: ``../shared/scenarios/README.md``, the planner's files) gives, for N devices,
``links.latency_ms`` (one-way delay, row = sender) and ``links.bandwidth_gbps`` (row = sender), and
optionally per device ``upload_gbps`` / ``download_gbps``. The emulator reads only those fields, so
any planner scenario runs here; ``bandwidth_scale`` turns datacenter Gbit/s into rates a Python relay
on a small machine can carry (0.01 turns 1 Gbit/s into 10 Mbit/s).

A packet a -> b is serialised on a's upload, then on the pair's rate, waits the one-way delay, then is
serialised on b's download. So the rate a TCP flow a -> b can reach is the smallest of the three and
its round trip is ``latency[a][b] + latency[b][a]``.

A device with ``"nat": "cone"`` or ``"symmetric"`` sits behind a home router (``potluck.testbed.wan.nat``):
it can dial out, but nobody can dial it until it has sent to them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from potluck.testbed.errors import TestbedError
from potluck.testbed.wan.nat import KINDS as NAT_KINDS

BUNDLED = Path(__file__).resolve().parent.parent / "scenarios"
INF = math.inf

Matrix = tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class WanSpec:
    """Links of an emulated WAN in the relay's units: milliseconds and Mbit/s (``INF`` = no limit)."""

    name: str
    latency_ms: Matrix  # one-way delay, [sender][receiver]
    pair_mbps: Matrix  # rate of the path, [sender][receiver]
    up_mbps: tuple[float, ...]  # each device's upload (shared by all it sends)
    down_mbps: tuple[float, ...]  # each device's download (shared by all who send to it)
    groups: tuple[str, ...] = ()
    nat: tuple[str, ...] = ()  # per device: "" (public address), "cone" or "symmetric"

    def nat_of(self, i: int) -> str:
        return self.nat[i] if self.nat else ""

    @property
    def n(self) -> int:
        return len(self.up_mbps)

    def target_mbps(self, a: int, b: int) -> float:
        """What one TCP flow a -> b can reach alone: the narrowest of a's upload, the pair, b's download."""
        return min(self.pair_mbps[a][b], self.up_mbps[a], self.down_mbps[b])

    def target_rtt_ms(self, a: int, b: int) -> float:
        return self.latency_ms[a][b] + self.latency_ms[b][a]


@dataclass(frozen=True)
class LinkTarget:
    a: int  # sender
    b: int  # receiver
    rtt_ms: float
    mbps: float


def link_targets(spec: WanSpec) -> list[LinkTarget]:
    """One target per direction of each pair, in (a, b) order."""
    return [
        LinkTarget(a, b, spec.target_rtt_ms(a, b), spec.target_mbps(a, b))
        for a in range(spec.n)
        for b in range(spec.n)
        if a != b
    ]


def resolve(name_or_path: str) -> Path:
    """A file path, or the name of a bundled testbed scenario (``home-5``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    bundled = BUNDLED / f"{name_or_path}.json"
    if bundled.is_file():
        return bundled
    known = ", ".join(p.stem for p in sorted(BUNDLED.glob("*.json")))
    raise TestbedError(f"no scenario file {name_or_path!r} (bundled testbed scenarios: {known})")


def load_spec(name_or_path: str, bandwidth_scale: float = 1.0, latency_scale: float = 1.0) -> WanSpec:
    path = resolve(name_or_path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TestbedError(f"{path}: cannot read the scenario: {exc}") from exc
    return spec_from_dict(raw, bandwidth_scale, latency_scale, default_name=path.stem)


def spec_from_dict(
    raw: dict[str, Any], bandwidth_scale: float = 1.0, latency_scale: float = 1.0, default_name: str = ""
) -> WanSpec:
    """Parse a scenario's devices and links; rates become Mbit/s times ``bandwidth_scale``."""
    if bandwidth_scale <= 0 or latency_scale < 0:
        raise TestbedError("bandwidth scale must be > 0 and latency scale >= 0")
    try:
        devices = raw["devices"]
        links = raw["links"]
        n = len(devices)
        if not 2 <= n <= 250:
            raise TestbedError(f"scenario {default_name!r}: the testbed emulates 2..250 devices, not {n}")
        lat = _matrix(links["latency_ms"], n, "links.latency_ms", latency_scale, allow_zero=True)
        pair = _matrix(links["bandwidth_gbps"], n, "links.bandwidth_gbps", 1000.0 * bandwidth_scale)
        up = tuple(
            _rate(d.get("upload_gbps"), bandwidth_scale, f"devices[{i}]") for i, d in enumerate(devices)
        )
        down = tuple(
            _rate(d.get("download_gbps"), bandwidth_scale, f"devices[{i}]") for i, d in enumerate(devices)
        )
        groups = tuple(str(d.get("group", "")) for d in devices)
        nat = tuple(_nat(d.get("nat"), f"devices[{i}]") for i, d in enumerate(devices))
    except (KeyError, TypeError, ValueError) as exc:
        raise TestbedError(f"scenario {default_name!r}: {type(exc).__name__}: {exc}") from exc
    name = str(raw.get("name", default_name))
    return WanSpec(name, lat, pair, up, down, groups, nat if any(nat) else ())


def with_nat(spec: WanSpec, nat: dict[int, str]) -> WanSpec:
    """``spec`` with the devices in ``nat`` put behind home routers of the given kinds."""
    kinds = [spec.nat_of(i) for i in range(spec.n)]
    for i, kind in nat.items():
        if not 0 <= i < spec.n:
            raise TestbedError(f"no device {i} in a {spec.n}-device scenario")
        try:
            kinds[i] = _nat(kind, f"device {i}")
        except ValueError as exc:
            raise TestbedError(str(exc)) from None
    return replace(spec, nat=tuple(kinds) if any(kinds) else ())


def parse_nat(text: str) -> dict[int, str]:
    """``"2:cone,4:symmetric"`` -> ``{2: "cone", 4: "symmetric"}`` (a bare index means cone)."""
    out: dict[int, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        index, _, kind = item.partition(":")
        try:
            out[int(index)] = kind or "cone"
        except ValueError:
            hint = "--nat wants DEVICE[:KIND] items, e.g. 2:cone,4:symmetric"
            raise TestbedError(f"{hint}; got {item!r}") from None
    return out


def _nat(value: object, where: str) -> str:
    if value in (None, False, ""):
        return ""
    if value is True:
        return "cone"
    if value in NAT_KINDS:
        return str(value)
    raise ValueError(f"{where}: nat must be one of {', '.join(NAT_KINDS)} (or true for cone), got {value!r}")


def _rate(gbps: object, scale: float, where: str) -> float:
    if gbps is None:
        return INF
    value = float(gbps)  # type: ignore[arg-type]
    if not value > 0:
        raise ValueError(f"{where}: rates must be > 0, got {gbps!r}")
    return value * 1000.0 * scale


def _matrix(
    rows: Sequence[Sequence[float]], n: int, what: str, scale: float, allow_zero: bool = False
) -> Matrix:
    if len(rows) != n or any(len(r) != n for r in rows):
        raise ValueError(f"{what} must be {n} x {n}")
    out = []
    for a, row in enumerate(rows):
        vals = []
        for b, v in enumerate(row):
            x = float(v)
            if a != b and not (x >= 0 if allow_zero else x > 0):
                raise ValueError(f"{what}[{a}][{b}] = {v!r} is out of range")
            vals.append(x * scale if a != b else 0.0)
        out.append(tuple(vals))
    return tuple(out)
