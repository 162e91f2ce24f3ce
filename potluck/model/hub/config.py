"""A Hugging Face ``config.json`` as ModelSpec fields, and back.

Supported: the Llama family as ``transformers`` defines it (``llama``, ``qwen2``, ``mistral`` without a
sliding window shorter than the job's ``seq_len``): grouped-query attention, the rotary base and Llama
3.1's scaling, tied embeddings, the SwiGLU width, the RMSNorm epsilon, Qwen2's q/k/v biases. Both
spellings of the rotary settings are read: ``rope_parameters`` (transformers 5) and ``rope_theta`` with
``rope_scaling`` (older files).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from potluck.model.errors import HubError
from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobspec import JobSpec, ModelSpec, RopeScaling, owner_path, parse_job, read_job_file

SUPPORTED = ("llama", "qwen2", "mistral")
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB; refuse to parse anything near this
CONFIG = "config.json"
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
# shape fields a job may also give next to ``from`` (then they must agree with config.json)
SHAPE_FIELDS = (
    "n_layers", "d_model", "n_heads", "vocab_size", "n_kv_heads", "ffn_width", "rope_theta",
    "rope_scaling", "norm_eps", "qkv_bias", "tie_embeddings", "max_positions", "family",
)  # fmt: skip


def read_config(directory: Path) -> dict[str, Any]:
    """``directory/config.json`` as a dict; HubError when missing, too large or not a JSON object."""
    path = directory / CONFIG
    try:
        raw = path.read_bytes() if path.stat().st_size <= MAX_CONFIG_BYTES else None
    except OSError as e:
        raise HubError(f"{path}: cannot read the model's config ({e.strerror})") from None
    if raw is None:
        raise HubError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a model config")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HubError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise HubError(f"{path}: not a JSON object")
    return data


def _rope(config: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
    params = config.get("rope_parameters")
    scaling: dict[str, Any] = {}
    if isinstance(params, dict):  # transformers 5: one dict with the base inside
        theta, scaling = params.get("rope_theta", config.get("rope_theta", 10000.0)), params
    else:  # older files: the base beside an optional scaling dict
        theta = config.get("rope_theta", 10000.0)
        scaling = config.get("rope_scaling") or {}
        if not isinstance(scaling, dict):
            raise HubError(f"{where}: rope_scaling is not an object")
    if float(config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise HubError(f"{where}: partial_rotary_factor != 1 is not supported (every dim rotates here)")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise HubError(f"{where}: rope type {kind!r} is not supported (supported: default, llama3)")
    try:
        return float(theta), RopeScaling(
            factor=scaling["factor"],
            low_freq_factor=scaling["low_freq_factor"],
            high_freq_factor=scaling["high_freq_factor"],
            original_max_positions=scaling["original_max_position_embeddings"],
        )
    except (KeyError, ValueError) as e:
        raise HubError(f"{where}: llama3 rope scaling incomplete or invalid ({e})") from None


def spec_fields(config: dict[str, Any], where: str = CONFIG) -> dict[str, Any]:
    """Pure: the ModelSpec fields a config describes (every shape field but ``seq_len``, a training
    choice). HubError naming the field for anything potluck's decoder cannot compute exactly."""
    family = config.get("model_type")
    if family not in SUPPORTED:
        raise HubError(f"{where}: model_type {family!r} is not supported (supported: {', '.join(SUPPORTED)})")
    try:
        d, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        fields: dict[str, Any] = {
            "n_layers": int(config["num_hidden_layers"]),
            "d_model": d,
            "n_heads": heads,
            "vocab_size": int(config["vocab_size"]),
            "n_kv_heads": int(config.get("num_key_value_heads") or heads),
            "ffn_width": int(config["intermediate_size"]),
            "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
            "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
            "max_positions": int(config.get("max_position_embeddings") or 0) or None,
            "qkv_bias": family == "qwen2",  # Qwen2's q, k, v always carry biases; its output none
            "family": family,
        }
    except KeyError as e:
        raise HubError(f"{where}: missing {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise HubError(f"{where}: a shape field is not a number ({e})") from None
    head_dim = config.get("head_dim")
    if head_dim is not None and heads and int(head_dim) != d // heads:
        raise HubError(f"{where}: head_dim {head_dim} != hidden_size / num_attention_heads ({d // heads})")
    if config.get("hidden_act", "silu") != "silu":
        raise HubError(f"{where}: hidden_act {config.get('hidden_act')!r} is not supported (SwiGLU: silu)")
    for flag in ("attention_bias", "mlp_bias"):
        if family != "qwen2" and config.get(flag):
            raise HubError(f"{where}: {flag} = true is not supported (no biases but Qwen2's q, k, v)")
    fields["rope_theta"], fields["rope_scaling"] = _rope(config, where)
    return fields


def _window(config: dict[str, Any]) -> int | None:
    """The sliding window in effect, or None (Qwen2 uses it only with use_sliding_window)."""
    if config.get("model_type") == "qwen2" and not config.get("use_sliding_window", False):
        return None
    window = config.get("sliding_window")
    return int(window) if window else None


def expand_model(model: dict[str, Any], base: Path) -> dict[str, Any]:
    """A job file's ``[model]`` table with ``from = DIR`` filled in from ``DIR/config.json`` (``DIR``
    relative to ``base``, the job file's directory). Fields the table also gives must agree. A table
    without ``from`` comes back unchanged."""
    source = model.get("from")
    if source is None:
        return model
    if not isinstance(source, str) or not source:
        raise HubError("model.from: a path to a Hugging Face model directory")
    directory = owner_path(base, source)
    where = str(directory / CONFIG)
    config = read_config(directory)
    fields = spec_fields(config, where)
    window, seq_len = _window(config), model.get("seq_len")
    if window is not None and isinstance(seq_len, int) and window < seq_len:
        raise HubError(f"{where}: a sliding window of {window} < seq_len {seq_len} is not supported")
    given = {k: model[k] for k in SHAPE_FIELDS if k in model}
    if given:
        ours = ModelSpec.model_validate({**fields, "seq_len": 2})
        try:
            theirs = ModelSpec.model_validate({**fields, **given, "seq_len": 2})
        except ValueError as e:
            raise HubError(f"model: {e}") from None
        for key in given:
            if getattr(theirs, key) != getattr(ours, key):
                raise HubError(
                    f"model.{key} = {given[key]!r} disagrees with {where} ({getattr(ours, key)!r}); "
                    "leave it out: a model `from` a directory takes its shape from there"
                )
    return {**model, **fields}


def hf_config(spec: ModelSpec, tied: bool) -> dict[str, Any]:
    """The ``config.json`` of an export: the family the job came from (``llama`` for a native job), its
    shape, and the rotary settings in transformers 5's spelling. ``tied``: whether the head is written
    as the embedding (only when the two are still equal, bit for bit)."""
    family = spec.family or "llama"
    rope: dict[str, Any] = {"rope_theta": spec.rope_theta, "rope_type": "default"}
    if spec.rope_scaling is not None:
        s = spec.rope_scaling
        rope |= {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_positions,
        }
    config: dict[str, Any] = {
        "architectures": [
            {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}[
                family
            ]
        ],
        "model_type": family,
        "hidden_size": spec.d_model,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.ffn_hidden,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_positions or spec.seq_len,
        "rms_norm_eps": spec.norm_eps,
        "hidden_act": "silu",
        "rope_parameters": rope,
        "rope_theta": spec.rope_theta,  # older readers look here
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    if family == "llama":
        config |= {"attention_bias": False, "mlp_bias": False}
    if family in ("mistral", "qwen2"):
        config |= {"sliding_window": None, "use_sliding_window": False}
    return config


def load_job_file(path: Path) -> JobSpec:
    """``protocol.jobspec.load_job`` for a job whose ``[model]`` may come ``from`` a Hugging Face
    directory (read relative to the job file, on this machine: the job owner's); every problem is a
    ``JobSpecError`` naming the file."""
    data = read_job_file(path)
    model = data.get("model")
    if isinstance(model, dict) and "from" in model:
        try:
            data = {**data, "model": expand_model(model, path.parent)}
        except HubError as e:
            raise JobSpecError(f"{path}: {e}") from None
    return parse_job(data, source=str(path))
