"""`potluck plan`: run the planner on a scenario file and print the placement."""

from __future__ import annotations

import json
import time

import typer

from potluck.coordinator.errors import CoordinatorError


def _plan(
    scenario: str = typer.Option(..., "--scenario", "-s", help="Scenario file or bundled name (dtfm-case1)"),
    objective: str = typer.Option("step", "--objective", help="dtfm (DT-FM's COMM-COST) or step (step time)"),
    seed: int = typer.Option(0, "--seed", help="Search seed; same seed, same plan."),
    time_limit: float = typer.Option(5.0, "--time-limit", help="Search time limit, seconds."),
    bound_time_limit: float = typer.Option(2.0, "--bound-time-limit", help="Lower-bound solver limit, s."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Place a scenario's devices into pipeline stages and data-parallel replicas."""
    from potluck.coordinator.placement import PlannerConfig, plan  # scipy, networkx: only when run
    from potluck.coordinator.placement.scenario import load_scenario

    if objective not in ("dtfm", "step"):
        raise typer.BadParameter("must be 'dtfm' or 'step'", param_hint="--objective")
    try:
        sc = load_scenario(scenario)
    except CoordinatorError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if objective == "dtfm" and sc.dtfm_job is None:
        typer.echo("error: scenario has no DT-FM job constants (job.D_PP, D_DP, c_dp_GB, c_pp_GB)", err=True)
        raise typer.Exit(2)
    job = sc.dtfm_job if objective == "dtfm" else sc.step_job
    assert job is not None
    cfg = PlannerConfig(seed=seed, time_limit_s=time_limit, bound_time_limit_s=bound_time_limit)
    start = time.monotonic()
    result, reason = plan(sc.state, job, now=time.time(), previous=None, cfg=cfg)
    solve = time.monotonic() - start
    if result is None:
        if as_json:
            typer.echo(json.dumps({"stages": None, "reason": reason, "solve_seconds": solve}))
        else:
            typer.echo(f"no plan: {reason}", err=True)
        raise typer.Exit(1)
    if as_json:
        out = {
            "stages": [list(row) for row in result.stages],
            "spares": list(result.spares),
            "cost": result.cost,
            "lower_bound": result.lower_bound,
            "solve_seconds": solve,
            "reason": reason,
            "objective": result.objective,
            "bound_method": result.bound_method,
            "layers": list(result.layers),
            "micro_batches": result.micro_batches,
        }
        typer.echo(json.dumps(out))
        return
    typer.echo(f"scenario   {sc.name}: {len(sc.state.peers)} devices")
    shape = f"{result.n_stages} stages x {result.n_replicas} replicas"
    typer.echo(f"objective  {result.objective}   shape {shape}   spares {len(result.spares)}")
    bound = f"{result.lower_bound:.3f} s ({result.bound_method})"
    typer.echo(f"cost       {result.cost:.3f} s   lower bound {bound}   gap <= {100 * result.gap:.1f}%")
    typer.echo(f"solved in  {solve:.2f} s   ({reason})")
    if result.layers:
        typer.echo(f"layers     {list(result.layers)}   micro-batches {result.micro_batches}")
    for j, row in enumerate(result.stages):
        typer.echo(f"stage {j:>3}  " + " ".join(f"{p!s:>4}" for p in row))
    if result.spares:
        typer.echo("spares     " + " ".join(str(p) for p in result.spares))


def register(app: typer.Typer) -> None:
    app.command("plan")(_plan)
