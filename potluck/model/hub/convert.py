"""From a Hugging Face directory to the swarm's step 0, and from a checkpoint back to a directory.

``pretrained_checkpoint``: a job ``from`` a model directory starts from its weights. ``potluck launch``
writes them once, as step 0 of the job owner's checkpoint copy (one stage a layer, weights only: AdamW
starts empty); the coordinator serves that copy like any other, so each peer pulls exactly its stage's
layers over the swarm, hash-checked, and a volunteer never copies the model.

``export_checkpoint``: a complete checkpoint as a directory ``transformers.AutoModelForCausalLM`` loads:
``config.json`` (the family the job came from; ``llama`` for a native job), the weights in safetensors
(one file, or shards with their index past ``max_shard_bytes``), ``generation_config.json`` and the
job's tokenizer file. Weights only; the optimizer state stays in potluck's checkpoint.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from potluck.model.checkpoint import save_stage
from potluck.model.errors import HubError
from potluck.model.hub.config import hf_config
from potluck.model.hub.names import ENDS, LAYER_PARTS, layer_to_hf
from potluck.model.hub.read import HubWeights
from potluck.model.sampling import checkpoint_tokenizer_file, load_model
from potluck.protocol.checkpoints import (
    CheckpointRef,
    StageMeta,
    check_step,
    manifest_path,
    read_manifest,
    step_dir,
)
from potluck.protocol.errors import CheckpointError
from potluck.protocol.jobspec import JobSpec, ModelSpec

logger = logging.getLogger(__name__)

MAX_SHARD_BYTES = 2 << 30  # weights per safetensors file of an export; more: shards with an index


def pretrained_checkpoint(job: JobSpec, directory: Path, root: Path) -> Path | None:
    """Write step 0 of ``job`` under ``root`` from ``directory``'s weights, unless that very step 0 is
    there already (a relaunch; another model's step 0 is replaced). One stage per layer, the embedding
    with the first and the final norm and head with the last, so that serving a stage reads only its
    own layers. Returns the step directory written, or None."""
    spec = job.model
    existing = step_dir(root, 0)
    try:
        ref = check_step(existing)
        if (
            read_manifest(manifest_path(existing, 0), 0, 0).meta.model == spec
            and ref.n_stages == spec.n_layers
        ):
            logger.info("step 0 of %s is already at %s", job.name, existing)
            return None
    except CheckpointError:
        pass
    n = 0
    with HubWeights(directory) as hub:  # its index read and its files opened once, for every layer
        for layer in range(spec.n_layers):
            n += _write_layer(job, hub.stage(spec, layer, layer + 1), layer, root)
    logger.info("step 0 of %s from %s: %d parameters at %s", job.name, directory, n, existing)
    return existing


def _write_layer(job: JobSpec, tensors: dict[str, torch.Tensor], layer: int, root: Path) -> int:
    """Layer ``layer`` as stage ``layer`` of step 0; returns its parameter count."""
    spec = job.model
    meta = StageMeta(
        job=job.name,
        step=0,
        stage=layer,
        n_stages=spec.n_layers,
        first_layer=layer,
        last_layer=layer + 1,
        model=spec,
        seed=job.seed,
        tokenizer=job.data.tokenizer,
        epoch=0,
    )
    save_stage(root, {f"model.{k}": v for k, v in tensors.items()}, meta)
    return sum(t.numel() for t in tensors.values())


@dataclass(frozen=True)
class Export:
    directory: Path
    step: int
    files: tuple[str, ...]
    n_params: int
    tied: bool  # the head written as the embedding (still equal, bit for bit)


def hf_tensors(spec: ModelSpec, weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], bool]:
    """A whole model's potluck weights (global layer names, no ``model.`` prefix) as HF tensors; and
    whether the head is left out as tied (a tied model whose head still equals its embedding)."""
    if any(name.startswith("boundaries.") for name in weights):
        raise HubError(
            "this model has bottleneck maps at its stage cuts (model.bottleneck_rank): they are part of "
            "what it computes and no Hugging Face architecture has them, so it cannot be exported"
        )
    out: dict[str, torch.Tensor] = {}
    for layer in range(spec.n_layers):
        prefix = f"layers.{layer}."
        own = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        if set(own) - set(LAYER_PARTS):
            raise HubError(f"layer {layer}: unexpected tensors {sorted(set(own) - set(LAYER_PARTS))}")
        out |= layer_to_hf(spec, layer, own)
    for ours, theirs in ENDS.items():
        out[theirs] = weights[ours].contiguous()
    tied = spec.tie_embeddings and torch.equal(out[ENDS["head.weight"]], out[ENDS["embed.weight"]])
    if tied:
        del out[ENDS["head.weight"]]
    return out, tied


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    return shards


def export_checkpoint(
    ref: CheckpointRef,
    out: Path,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    tokenizer_file: Path | None = None,
) -> Export:
    """Write ``ref`` (a complete checkpoint) to ``out`` as a Hugging Face model directory, with the job's
    tokenizer (``tokenizer_file``, else the one kept with the checkpoints: sampling.py)."""
    stages, spec, meta = load_model(ref)
    weights: dict[str, torch.Tensor] = {}
    for stage in stages:
        for name, tensor in stage.state_dict().items():
            parts = name.split(".")
            if parts[0] == "layers":
                parts[1] = str(int(parts[1]) + stage.first)
            weights[".".join(parts)] = tensor
    tensors, tied = hf_tensors(spec, weights)
    tensors = {k: v.to(dtype).contiguous() for k, v in tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(spec, tied) | {
        "torch_dtype": str(dtype).removeprefix("torch."),
        "dtype": str(dtype).removeprefix("torch."),
    }
    shards = _shards(tensors, max_shard_bytes)
    files: list[str] = []
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        files.append("model.safetensors")
    else:
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            weight_map |= dict.fromkeys(shard, name)
            files.append(name)
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
        files.append("model.safetensors.index.json")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "generation_config.json").write_text(json.dumps({"_from_model_config": True}, indent=2))
    files += ["config.json", "generation_config.json"]
    if (tokenizer := checkpoint_tokenizer_file(meta, ref.root, tokenizer_file)) is not None:
        shutil.copyfile(tokenizer, out / "tokenizer.json")
        files.append("tokenizer.json")
    n_params = sum(t.numel() for t in tensors.values())
    logger.info("exported step %d of %s to %s (%d parameters)", ref.step, meta.job, out, n_params)
    return Export(out, ref.step, tuple(files), n_params, tied)
