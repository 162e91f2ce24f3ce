#!/usr/bin/env python
"""Plans of a shipped DT-FM scenario under three activation-codec settings (issue 22):

* ``default``: the job's default chain on every link (``compression.activations = "int8:block=64"``);
* ``strong``: a stronger chain on every link (``--strong``, default ``int4:block=32|zstd``);
* ``selective``: the default chain on fast links, the strong one on directions slower than
  ``--slow-gbps`` (``compression.activations_slow`` + ``slow_link_gbps``).

The step-time objective prices every boundary at its link's chain (``coordinator/job/codecs.py``), as the
coordinator does. For each setting it prints the predicted step time, the shape (stages x replicas),
the layer split, how much of the step is pipeline vs exposed gradient sync, how many boundary
directions carry the strong chain, and what changed against ``default``: the default placement
re-priced under the setting's codecs (the codec alone), and how many peers the new search moved.

    PYTHONPATH=. .venv/bin/python scripts/bench_codec_plans.py --scenario dtfm-case5 --json
    PYTHONPATH=. .venv/bin/python scripts/bench_codec_plans.py --scenario dtfm-case5 --compute-scale 10 \
        --strong 'int2:block=64|zstd'      # devices 10x as fast: the links matter, plans change

``--compute-scale K`` makes every device K times as fast with the links unchanged (the shipped
scenarios' devices are slow enough that compute hides most transfers); ``--width W`` puts a
bottleneck of rank W x d_model at every cut (``model.bottleneck_rank``), pricing the cuts at W times
the codec's estimate.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from potluck.coordinator.job.codecs import canonical_chain, codec_ratios, select_link_codecs
from potluck.coordinator.placement import PlacementPlan, PlannerConfig, plan
from potluck.coordinator.placement.objectives import fixed_breakdown
from potluck.coordinator.placement.scenario import Scenario, load_scenario
from potluck.protocol.jobspec import CompressionSpec


def settings(strong: str, slow_gbps: float) -> dict[str, CompressionSpec]:
    return {
        "default": CompressionSpec(),
        "strong": CompressionSpec(activations=strong),
        "selective": CompressionSpec(activations_slow=strong, slow_link_gbps=slow_gbps),
    }


def grid_of(sc: Scenario, placement: PlacementPlan) -> list[list[int]]:
    index = {p: i for i, p in enumerate(sc.state.peers)}
    return [[index[p] for p in row] for row in placement.stages]


def stage_of(placement: PlacementPlan) -> dict[str, int]:
    """peer -> its stage (-1: a spare); pipelines are interchangeable, so the replica does not count."""
    placed = {str(p): j for j, row in enumerate(placement.stages) for p in row}
    return placed | {str(p): -1 for p in placement.spares}


def scaled(sc: Scenario, compute_scale: float) -> Scenario:
    """The scenario with every device ``compute_scale`` x as fast (the network unchanged)."""
    devices = tuple(replace(d, tflops=d.tflops * compute_scale) for d in sc.state.devices)
    return replace(sc, state=replace(sc.state, devices=devices))


def run(
    scenario: str,
    strong: str,
    slow_gbps: float,
    time_limit: float,
    seed: int,
    compute_scale: float = 1.0,
    width: float = 1.0,
) -> dict:
    sc = scaled(load_scenario(scenario), compute_scale)
    out: dict = {"scenario": sc.name, "strong": strong, "slow_link_gbps": slow_gbps, "settings": {}}
    out |= {"compute_scale": compute_scale, "width": width}
    base: PlacementPlan | None = None
    for name, comp in settings(strong, slow_gbps).items():
        job = replace(sc.step_job, codecs=codec_ratios(comp, None, width))
        t0 = time.monotonic()
        placement, _ = plan(sc.state, job, 0.0, None, PlannerConfig(seed=seed, time_limit_s=time_limit))
        solve = time.monotonic() - t0
        assert placement is not None
        grid = grid_of(sc, placement)
        br = fixed_breakdown(sc.state.net, sc.state.devices, job, grid)
        links = select_link_codecs(grid, sc.state.net, comp)
        directions = 2 * (len(grid) - 1) * len(grid[0])
        if links is None:  # every direction carries the job's chain
            chains = [canonical_chain(comp.activations)] * directions
        else:
            chains = [links.chains[k] for row in (*links.forward, *links.backward) for k in row]
        strong_dirs = sum(c == canonical_chain(strong) for c in chains)
        row = {
            "predicted_step_s": round(placement.cost, 4),
            "shape": f"{placement.n_stages}x{placement.n_replicas}",
            "layers": list(placement.layers),
            "micro_batches": placement.micro_batches,
            "pipeline_s": round(br.pipeline, 4),
            "dp_exposed_s": round(br.dp_exposed, 4),
            "slowest_link_s": round(max(br.link, default=0.0), 4),
            "strong_directions": strong_dirs,
            "directions": directions,
            "solve_s": round(solve, 2),
            "ratios": {
                "fast": round(job.codecs.activation_lan, 4),
                "slow": round(job.codecs.activation_wan, 4),
            },
        }
        if base is None:
            base = placement
        else:
            # the default plan's placement priced with this setting's codecs: what the codec alone changes
            row["default_placement_s"] = round(
                fixed_breakdown(sc.state.net, sc.state.devices, job, grid_of(sc, base)).total, 4
            )
            before, after = stage_of(base), stage_of(placement)
            row["peers_moved"] = sum(before.get(p) != at for p, at in after.items())
            row["shape_changed"] = (base.n_stages, base.n_replicas) != (
                placement.n_stages,
                placement.n_replicas,
            )
        out["settings"][name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="dtfm-case5")
    ap.add_argument("--strong", default="int4:block=32|zstd")
    ap.add_argument("--slow-gbps", type=float, default=1.5, help="selective: links slower than this, Gbit/s")
    ap.add_argument("--time-limit", type=float, default=5.0, help="planner search per setting, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compute-scale", type=float, default=1.0, help="devices this many times as fast")
    ap.add_argument("--width", type=float, default=1.0, help="a bottleneck at every cut: rank / d_model")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    res = run(
        args.scenario, args.strong, args.slow_gbps, args.time_limit, args.seed, args.compute_scale, args.width
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(
        f"{res['scenario']}: strong = {res['strong']}, slow links < {res['slow_link_gbps']} Gbit/s, "
        f"compute x{res['compute_scale']:g}, cut width x{res['width']:g}"
    )
    head = ("setting", "step s", "shape", "pipe s", "dp s", "link s", "strong/dirs", "old plan s", "moved")
    print("".join(f"{h:>12}" for h in head))
    for name, r in res["settings"].items():
        cells = (
            name,
            f"{r['predicted_step_s']:.3f}",
            r["shape"],
            f"{r['pipeline_s']:.3f}",
            f"{r['dp_exposed_s']:.3f}",
            f"{r['slowest_link_s']:.3f}",
            f"{r['strong_directions']}/{r['directions']}",
            f"{r.get('default_placement_s', float('nan')):.3f}",
            str(r.get("peers_moved", "-")),
        )
        print("".join(f"{c:>12}" for c in cells))


if __name__ == "__main__":
    main()
