"""Scenario files: devices, full link matrices and job constants (format: scenarios/README in docs).

`load_scenario` accepts a path or the name of a bundled scenario (`dtfm-case1` matches
`dtfm-case1-datacenter-on-demand.json`). Optional per-device fields: tflops (effective TFLOP/s),
memory_gb, upload_gbps, download_gbps; an optional `job.step` block gives the model and batch for the
step-time objective (defaults describe the GPT3-XL runs of the DT-FM paper).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from potluck.coordinator.errors import NetModelError, ScenarioError
from potluck.coordinator.placement.costmodel import (
    BatchSpec,
    CodecRatios,
    DeviceSpec,
    DtfmJob,
    ModelShape,
    StepJob,
)
from potluck.coordinator.placement.netmodel import from_matrices
from potluck.coordinator.placement.types import PlanningState

BUNDLED = Path(__file__).parent / "scenarios"

# Effective dense fp16 TFLOP/s we assume for a GPU model when the scenario gives none (roughly 40-50%
# of the datasheet peak, what transformer training reaches); the peer probe measures the real value.
_GPU_TFLOPS = {"H100": 400.0, "A100": 150.0, "V100": 50.0, "4090": 80.0, "3090": 35.0, "T4": 15.0}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    state: PlanningState
    dtfm_job: DtfmJob | None
    step_job: StepJob
    groups: tuple[str, ...]  # per device, informational (the planner does not read it)


def resolve(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    matches = sorted(BUNDLED.glob(f"{name_or_path}*.json"))
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(p.stem for p in sorted(BUNDLED.glob("*.json")))
    if not matches:
        raise ScenarioError(f"no scenario file or bundled scenario {name_or_path!r}; bundled: {known}")
    raise ScenarioError(f"{name_or_path!r} matches several bundled scenarios: {[m.stem for m in matches]}")


def _device(raw: dict[str, Any]) -> DeviceSpec:
    gpu = str(raw.get("gpu", ""))
    tflops = raw.get("tflops")
    if tflops is None:
        tflops = next((v for k, v in _GPU_TFLOPS.items() if k in gpu), 50.0)
    memory = raw.get("memory_gb")
    if memory is None:
        found = re.search(r"(\d+)\s*GB", gpu)
        memory = float(found.group(1)) if found else 16.0
    if float(tflops) <= 0 or float(memory) <= 0:
        raise ScenarioError(f"device {raw.get('id')}: tflops and memory_gb must be > 0")
    return DeviceSpec(float(tflops), float(memory))


def _step_job(job: dict[str, Any]) -> StepJob:
    step = job.get("step", {})
    layers = int(step.get("layers", int(job.get("D_PP", 8)) * int(job.get("layers_per_stage", 3))))
    model = ModelShape(
        layers=layers,
        d_model=int(step.get("d_model", 2048)),
        heads=int(step.get("heads", 16)),
        vocab=int(step.get("vocab", 50257)),
        seq_len=int(step.get("seq_len", 2048)),
    )
    batch = BatchSpec(int(step.get("sequences_per_step", 1024)), int(step.get("micro_batch", 1)))
    codecs = CodecRatios(**step.get("codecs", {}))
    return StepJob(model=model, batch=batch, codecs=codecs)


def load_scenario(name_or_path: str) -> Scenario:
    path = resolve(name_or_path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"{path}: {type(exc).__name__}: {exc}") from exc
    return scenario_from_dict(raw, path.stem, str(path))


def scenario_from_dict(
    raw: dict[str, Any], default_name: str = "scenario", where: str = "scenario"
) -> Scenario:
    """A scenario from its parsed JSON (a generated swarm, a file's contents); `where` names it in errors."""
    try:
        devices = raw["devices"]
        links = raw["links"]
        job = raw.get("job", {})
        ups = [d.get("upload_gbps") for d in devices]
        downs = [d.get("download_gbps") for d in devices]
        net = from_matrices(
            links["latency_ms"],
            links["bandwidth_gbps"],
            [float("inf") if u is None else float(u) for u in ups],
            [float("inf") if v is None else float(v) for v in downs],
        )
        state = PlanningState(tuple(d["id"] for d in devices), tuple(_device(d) for d in devices), net)
        dtfm = None
        if "D_PP" in job:
            dtfm = DtfmJob(int(job["D_PP"]), int(job["D_DP"]), float(job["c_dp_GB"]), float(job["c_pp_GB"]))
        return Scenario(
            name=str(raw.get("name", default_name)),
            description=str(raw.get("description", "")),
            state=state,
            dtfm_job=dtfm,
            step_job=_step_job(job),
            groups=tuple(str(d.get("group", "")) for d in devices),
        )
    except (ValueError, KeyError, TypeError, NetModelError) as exc:
        raise ScenarioError(f"{where}: {type(exc).__name__}: {exc}") from exc
