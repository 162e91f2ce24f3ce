"""Text from a trained checkpoint: rebuild every pipeline stage in one process and sample from the chain.

This is for looking at what a job has learned (``potluck generate``), not for serving: there is no KV
cache, so each new token reruns the whole (cropped) context through every stage, which costs
O(new tokens x seq_len) forward positions; that is fine for the model sizes a swarm trains here.
"""

from __future__ import annotations

import logging
import math
from itertools import pairwise
from pathlib import Path

import torch

from potluck.model.bottleneck import boundary_of
from potluck.model.checkpoint import CheckpointRef, load_stage
from potluck.model.data import ByteTokenizer, Tokenizer, load_tokenizer
from potluck.model.errors import DataError
from potluck.model.transformer import StageModel
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.errors import CheckpointError
from potluck.protocol.jobspec import ModelSpec

logger = logging.getLogger(__name__)

MODEL_PREFIX = "model."  # stage tensors under other prefixes (optimizer state, ...) are not the model's
_SHARED_META = ("job", "step", "model", "seed", "tokenizer")  # StageMeta fields equal on every stage


def load_model(ref: CheckpointRef) -> tuple[list[StageModel], ModelSpec, StageMeta]:
    """Every stage of ``ref`` with its ``model.*`` weights loaded (strict), in eval mode, on the CPU.

    Returns (stages in pipeline order, the model spec, stage 0's meta). Raises CheckpointError when a
    stage is damaged (its meta included: ``read_manifest`` validates it), the stages disagree (model,
    seed, job, step, tokenizer), or their layers do not tile the model.
    """
    stages: list[StageModel] = []
    metas: list[StageMeta] = []
    for j in range(ref.n_stages):
        tensors, meta = load_stage(ref, j)
        if metas:
            differ = [k for k in _SHARED_META if getattr(meta, k) != getattr(metas[0], k)]
            if differ:
                raise CheckpointError(f"{ref.path} stage {j}: meta disagrees with stage 0 on {differ}")
        metas.append(meta)
        first, last, spec = meta.first_layer, meta.last_layer, meta.model
        expected_first = stages[-1].last if stages else 0
        if first != expected_first:  # StageMeta already holds first < last <= spec.n_layers
            raise CheckpointError(
                f"{ref.path} stage {j}: layers [{first}, {last}) do not follow [..., {expected_first}) "
                f"within {spec.n_layers} layers"
            )
        # the bottleneck positions this stage's maps were saved at (a plan's ``bottlenecks``)
        cuts = {where[0] for where in map(boundary_of, tensors) if where is not None}
        model = StageModel(spec, first, last, seed=meta.seed, cuts=cuts)
        weights = {k[len(MODEL_PREFIX) :]: v for k, v in tensors.items() if k.startswith(MODEL_PREFIX)}
        try:
            model.load_state_dict(weights, strict=True)
        except RuntimeError as e:
            raise CheckpointError(f"{ref.path} stage {j}: weights do not fit the model: {e}") from None
        stages.append(model.eval())
    if not metas or stages[-1].last != metas[0].model.n_layers:
        raise CheckpointError(
            f"{ref.path}: stages end at layer {stages[-1].last if stages else 0}, not the last"
        )
    logger.info("loaded %d stages of %s step %d", len(stages), metas[0].job, ref.step)
    return stages, metas[0].model, metas[0]


CHECKPOINT_TOKENIZER = "tokenizer.json"  # the job's tokenizer, kept beside its owner's checkpoints


def checkpoint_tokenizer_file(meta: StageMeta, root: Path, override: Path | None = None) -> Path | None:
    """Where the tokenizer the job trained with is: ``override`` (``--tokenizer``), else the copy
    ``potluck launch`` keeps in the checkpoint directory ``root``, else ``meta.tokenizer`` as a path from
    here; None for the byte tokenizer. DataError when the job had one and none of these is a file."""
    if override is not None:
        return override
    if meta.tokenizer is None:
        return None
    for candidate in (root / CHECKPOINT_TOKENIZER, Path(meta.tokenizer).expanduser()):
        if candidate.is_file():
            return candidate
    raise DataError(
        f"the job trained with tokenizer {meta.tokenizer!r}, which is neither in {root} nor at that path "
        "from here: pass --tokenizer FILE"
    )


def load_checkpoint_tokenizer(meta: StageMeta, root: Path, override: Path | None = None) -> Tokenizer:
    """The tokenizer the job trained with (``checkpoint_tokenizer_file``)."""
    file = checkpoint_tokenizer_file(meta, root, override)
    return ByteTokenizer() if file is None else load_tokenizer(str(file))


def _check_chain(stages: list[StageModel]) -> ModelSpec:
    if not stages:
        raise ValueError("no stages to generate with")
    spec = stages[0].spec
    if not stages[0].is_first or not stages[-1].is_last:
        raise ValueError("stages must run from the embedding (layer 0) to the output head")
    for a, b in pairwise(stages):
        if a.last != b.first or b.spec != spec:
            raise ValueError(f"stage [{a.first}, {a.last}) is not followed by [{b.first}, {b.last})")
    return spec


@torch.inference_mode()
def generate(
    stages: list[StageModel],
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int,
) -> list[int]:
    """Sample ``max_new_tokens`` tokens after ``prompt_ids``; returns the new tokens only.

    The context is cropped to the last ``spec.seq_len`` tokens (the rotary tables end there).
    ``temperature`` 0 is greedy argmax; otherwise logits are divided by it, cut to the ``top_k`` most
    likely (None: all), and sampled from a generator seeded with ``seed``: same inputs, same tokens.
    """
    spec = _check_chain(stages)
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one token")
    if any(not 0 <= t < spec.vocab_size for t in prompt_ids):
        raise ValueError(f"prompt token ids must be in [0, {spec.vocab_size})")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    device = next(stages[0].parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        context = torch.tensor([ids[-spec.seq_len :]], dtype=torch.long, device=device)
        h: torch.Tensor = context
        for stage in stages:
            h = stage(h, context)  # the ids too: a stage may re-embed them at a bottleneck
        logits = h[0, -1].float()  # (vocab,): the next-token scores after the last context position
        if temperature == 0:
            token = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))
        ids.append(token)
    return ids[len(prompt_ids) :]
