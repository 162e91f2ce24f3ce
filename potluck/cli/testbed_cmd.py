"""`potluck testbed`: build an emulated WAN from a scenario file, measure its links, tear it down.

Root only (network namespaces and TUN devices); see docs/testbed.md.
"""

from __future__ import annotations

import json

import typer

from potluck.cli.common import fail

testbed = typer.Typer(
    name="testbed",
    help="Emulated WAN links (root): one network namespace per peer, per-direction delay and rate.",
    no_args_is_help=True,
)


@testbed.command("check")
def check(
    scenario: str = typer.Option(..., "--scenario", "-s", help="Scenario file, or a bundled name (home-5)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    tolerance: float = typer.Option(0.1, "--tolerance", help="Allowed relative error of RTT and rate."),
    scale: float = typer.Option(
        1.0, "--scale", help="Multiply every rate by this (0.01: 1 Gbit/s becomes 10 Mbit/s)."
    ),
    latency_scale: float = typer.Option(1.0, "--latency-scale", help="Multiply every latency by this."),
    queue_ms: float = typer.Option(100.0, "--queue-ms", help="Drop-tail queue of each link: ms at its rate."),
    measure_s: float = typer.Option(
        1.0, "--measure-s", help="Seconds each rate is measured (after slow start)."
    ),
    pings: int = typer.Option(20, "--pings", help="Round trips per direction; the median is reported."),
    serial: bool = typer.Option(False, "--serial", help="One bulk flow at a time (default: disjoint pairs)."),
    nat: str = typer.Option(
        "", "--nat", help="Devices behind a home NAT, e.g. 2:cone,4:symmetric (links into them are skipped)."
    ),
) -> None:
    """Build the scenario's network, measure every direction's RTT and rate, tear it down.

    Exit code 0 when every link is within the tolerance, 1 when one is not, 2 on errors."""
    from potluck.testbed.errors import TestbedError
    from potluck.testbed.wan import WanLab, load_spec, sigterm_raises
    from potluck.testbed.wan.check import measure
    from potluck.testbed.wan.spec import parse_nat, with_nat

    try:
        spec = load_spec(scenario, bandwidth_scale=scale, latency_scale=latency_scale)
        if nat:
            spec = with_nat(spec, parse_nat(nat))
        with sigterm_raises(), WanLab(spec, queue_ms=queue_ms) as lab:
            report = measure(lab, tolerance=tolerance, pings=pings, measure_s=measure_s, serial=serial)
    except TestbedError as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(report.to_json()))
    else:
        typer.echo(f"scenario {report.scenario}: {spec.n} peers, tolerance {100 * tolerance:g}%")
        typer.echo(f"{'a':>3} {'b':>3}  {'RTT ms':>8} {'measured':>9}  {'Mbit/s':>8} {'measured':>9}  ok")
        for link in report.links:
            target = "-" if link.mbps_target is None else f"{link.mbps_target:.2f}"
            typer.echo(
                f"{link.a:>3} {link.b:>3}  {link.rtt_ms_target:>8.2f} {link.rtt_ms_measured:>9.2f}  "
                f"{target:>8} {link.mbps_measured:>9.2f}  {'yes' if link.ok(tolerance) else 'NO'}"
            )
        verdict = "all links within tolerance" if report.ok else "some links OUT of tolerance"
        typer.echo(f"{verdict}; relay CPU {report.relay_cpu_s:.2f} s over {report.elapsed_s:.1f} s")
    if not report.ok:
        raise typer.Exit(1)


@testbed.command("clean")
def clean() -> None:
    """Delete namespaces left by WAN labs whose process was killed outright (kill -9)."""
    from potluck.testbed.errors import TestbedError
    from potluck.testbed.wan.lab import delete_namespace, require_support, stale_namespaces

    try:
        require_support()
        stale = stale_namespaces()
        for name in stale:
            delete_namespace(name)
    except TestbedError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"deleted {len(stale)} stale namespace(s)" + (": " + " ".join(stale) if stale else ""))


def register(app: typer.Typer) -> None:
    app.add_typer(testbed)
