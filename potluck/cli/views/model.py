"""What a volunteer joins, in a few lines: the model (family, size, memory a stage needs), the data
(shipped or generated, its size) and what a new peer downloads. Shown by ``potluck launch`` under the
invite and by ``potluck status``; computed from the signed job alone."""

from __future__ import annotations

import math

from potluck.protocol.jobspec import JobSpec

STATE_BYTES_PER_PARAM = 12  # what a stage's state transfer moves: weights and two moments
GB, MB = 1e9, 1e6


def job_lines(job: JobSpec, n_stages: int | None = None) -> list[str]:
    """Human lines about ``job``; ``n_stages``: the plan's stages when known (else the memory of the
    whole model is given)."""
    m = job.model
    if job.kind != "pipeline":
        return [f"job {job.name}: {job.kind}"]
    params = m.n_params
    origin = "potluck's decoder"
    if m.family is not None:
        origin = f"{m.family} from {m.from_dir}" + (" (architecture only)" if not m.pretrained else "")
    heads = f"{m.n_heads} heads" + (f" / {m.kv_heads} kv" if m.kv_heads != m.n_heads else "")
    lines = [
        f"model: {origin}, {params / 1e6:,.1f}M parameters, {m.n_layers} layers, d {m.d_model}, {heads}, "
        f"vocab {m.vocab_size:,}, {m.seq_len} tokens a sequence"
    ]
    # the planner's own memory model (costmodel.layer_memory): torch, so imported only here
    from potluck.coordinator.job.plan import step_job
    from potluck.coordinator.placement.costmodel import layer_memory

    planned = step_job(job)
    state, act = layer_memory(planned)
    layers = math.ceil(m.n_layers / (n_stages or 1))
    ends = (1 if n_stages else 2) * m.embed_params  # the widest stage has one end table, a whole model both
    stage_params = layers * m.params_per_layer + ends
    need = layers * (state + act) + ends * planned.bytes_per_param  # one micro-batch of activations
    where = f"a stage of {layers} of {m.n_layers} layers" if n_stages else "the whole model on one peer"
    lines.append(
        f"memory: {where} needs about {need / GB:,.2f} GB (weights and AdamW at "
        f"{planned.bytes_per_param:g} B a parameter, one micro-batch of activations: the planner's estimate)"
    )
    d = job.data
    if d.fingerprint is not None and d.tokens is not None:
        shard_mb = d.shard_tokens * (2 if m.vocab_size <= 1 << 16 else 4) / MB
        n_shards = math.ceil(d.tokens / d.shard_tokens)
        lines.append(
            f"data: {d.path} shipped over the swarm, {d.tokens:,} tokens in {n_shards} shards of "
            f"{shard_mb:,.1f} MB (fingerprint {d.fingerprint[:12]})"
        )
        data_mb = min(n_shards, 3) * shard_mb  # a peer keeps two shards ahead of the one it reads
    else:
        source = f"{d.path} (each volunteer's copy)" if d.source == "directory" else "generated on each peer"
        lines.append(f"data: {source}")
        data_mb = 0.0
    state_mb = stage_params * STATE_BYTES_PER_PARAM / MB
    lines.append(
        f"a new peer downloads about {state_mb + data_mb:,.0f} MB to start: its stage's state "
        f"({state_mb:,.0f} MB at most) and the data its first steps read ({data_mb:,.0f} MB)"
    )
    return lines
