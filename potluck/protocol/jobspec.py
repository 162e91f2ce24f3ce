"""The job spec: what a person asks the swarm to train, as written in ``JOB.toml``.

Every section is its own model with bounded fields and defaults a first job can rely on; only
``name``, ``[model]`` and ``[batch]`` are required. Cross-field rules (heads divide the width, the batch
holds whole sequences, a directory source names its path) are checked here, so a bad job file fails at
``potluck launch`` with the field named, never on a peer halfway through training.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from potluck.protocol.classpar import NUM_GENERATED_CLASSES, ClassParSpec
from potluck.protocol.errors import JobSpecError
from potluck.protocol.records import Name, Record

CodecSpec = str  # a potluck.compression spec string; validated by ``get_codec`` where it is used


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ModelSpec fields left out of the signed record at these values (the releases before them signed none)
_MODEL_DEFAULTS: dict[str, object] = {
    "n_kv_heads": None,
    "ffn_width": None,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "norm_eps": 1e-6,
    "qkv_bias": False,
    "tie_embeddings": False,
    "max_positions": None,
    "family": None,
    "from_dir": None,
    "init": None,
    "weights_sha256": None,
}

ModelFamily = Literal["llama", "qwen2", "mistral"]  # the Hugging Face model types potluck runs


class RopeScaling(_Section):
    """Llama 3.1's rotary frequencies for long contexts (HF ``rope_type = "llama3"``): wavelengths past
    ``original_max_positions / low_freq_factor`` are stretched by ``factor``, those under
    ``original_max_positions / high_freq_factor`` kept, the band between blended."""

    type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0.0, le=1e6)
    low_freq_factor: float = Field(gt=0.0, le=1e6)
    high_freq_factor: float = Field(gt=0.0, le=1e6)
    original_max_positions: int = Field(ge=1, le=1 << 24)

    @model_validator(mode="after")
    def _band(self) -> RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("rope_scaling: high_freq_factor must exceed low_freq_factor")
        return self


class ModelSpec(_Section):
    """A decoder-only transformer, Llama-style (RMSNorm, rotary positions, SwiGLU)."""

    n_layers: int = Field(ge=1, le=1024)
    d_model: int = Field(ge=8, le=65536)
    n_heads: int = Field(ge=1, le=1024)
    vocab_size: int = Field(ge=2, le=1_048_576)
    seq_len: int = Field(ge=2, le=1_048_576)
    # A learned low-rank bottleneck at every stage cut (model/bottleneck.py): r numbers per token cross
    # a cut instead of d_model, both ways. None (the default): no bottleneck, and the field is left out
    # of the signed record, byte for byte what releases without it sign.
    bottleneck_rank: int | None = Field(default=None, ge=1, le=65536)
    # The token side path of the bottleneck (model/bottleneck.py): the stage after a cut adds a learned
    # embedding of the token ids it reads itself, so an embedded token crosses the cut exactly at init
    # instead of losing most of its identity. False (the default) is left out of the signed record, as
    # the rank is.
    bottleneck_tokens: bool = False
    # The Llama family's variations (a job ``from`` a Hugging Face directory takes them from its
    # config.json, potluck/model/hub/config.py). Each is left out of the signed record at its default,
    # so a native job signs byte for byte what releases without them signed.
    n_kv_heads: int | None = Field(default=None, ge=1, le=1024)  # grouped-query attention; None: n_heads
    ffn_width: int | None = Field(default=None, ge=1, le=1 << 20)  # SwiGLU hidden; None: the 8/3 d rule
    rope_theta: float = Field(default=10000.0, gt=1.0, le=1e12)  # rotary base (HF rope_theta)
    rope_scaling: RopeScaling | None = None  # Llama 3.1's long-context frequencies
    norm_eps: float = Field(default=1e-6, gt=0.0, le=1e-2)  # RMSNorm epsilon (HF rms_norm_eps)
    qkv_bias: bool = False  # biases on q, k and v (Qwen2), none on the output projection
    tie_embeddings: bool = False  # the head starts as the embedding (HF tie_word_embeddings; see docs)
    max_positions: int | None = Field(default=None, ge=2, le=1 << 24)  # HF max_position_embeddings
    family: ModelFamily | None = None  # the HF model_type it came from, and exports to; None: native
    # A local Hugging Face model directory (the job owner's; relative to the job file) and whether its
    # weights or only its architecture are used. Serialised as ``from``, the name the job file uses.
    from_dir: str | None = Field(
        default=None, max_length=1024, validation_alias=AliasChoices("from", "from_dir")
    )
    init: Literal["pretrained", "random"] | None = None  # None: "pretrained" with ``from``, else random
    # SHA-256 over the ``from`` directory's weight files (names and contents, model/hub/read.py): which
    # weights a pretrained job starts from. Set by ``potluck launch``.
    weights_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @field_validator("n_heads")
    @classmethod
    def _heads_divide_width(cls, v: int, info: object) -> int:
        d_model = getattr(info, "data", {}).get("d_model")
        if d_model is not None and (d_model % v or (d_model // v) % 2):
            raise ValueError(
                f"d_model ({d_model}) must be n_heads ({v}) times an even head width (rotary pairs)"
            )
        return v

    @model_validator(mode="after")
    def _kv_heads_group_queries(self) -> ModelSpec:
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if self.max_positions is not None and self.max_positions < self.seq_len:
            raise ValueError(
                f"seq_len ({self.seq_len}) exceeds the model's max_position_embeddings ({self.max_positions})"
            )
        if self.init == "pretrained" and self.from_dir is None:
            raise ValueError("init = 'pretrained' needs `from` (a Hugging Face model directory)")
        return self

    @model_validator(mode="after")
    def _rank_fits_width(self) -> ModelSpec:
        if self.bottleneck_rank is not None and self.bottleneck_rank > self.d_model:
            raise ValueError(
                f"bottleneck_rank ({self.bottleneck_rank}) must be at most d_model ({self.d_model})"
            )
        if self.bottleneck_tokens and self.bottleneck_rank is None:
            raise ValueError("bottleneck_tokens needs a bottleneck: set bottleneck_rank too")
        return self

    @model_serializer(mode="wrap")
    def _omit_default_rank(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        if out.get("bottleneck_rank", 0) is None:
            del out["bottleneck_rank"]
        if out.get("bottleneck_tokens") is False:
            del out["bottleneck_tokens"]
        for name, default in _MODEL_DEFAULTS.items():
            if name in out and out[name] == default:
                del out[name]
        if "from_dir" in out:
            out["from"] = out.pop("from_dir")
        return out

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or one per query head."""
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def pretrained(self) -> bool:
        """Whether the weights at step 0 are the ``from`` directory's (else the seeded init)."""
        return self.from_dir is not None and self.init != "random"

    @property
    def boundary_width(self) -> int:
        """Numbers per token crossing a stage cut (each way): the bottleneck's rank, else d_model."""
        return self.bottleneck_rank or self.d_model

    # The shape arithmetic below is the one source for the transformer (potluck.model.transformer builds
    # exactly these tensors, tested) and for the planner's cost model (ModelShape.from_spec).

    @property
    def ffn_hidden(self) -> int:
        """SwiGLU hidden width: ``ffn_width``, else about 8/3 d (the parameter count of a 4d GELU MLP)
        rounded up to a multiple of 64."""
        return self.ffn_width or 64 * math.ceil(8 * self.d_model / 3 / 64)

    @property
    def kv_width(self) -> int:
        """Width of k (and of v): one head_dim per key/value head; d_model without grouped queries."""
        return self.kv_heads * self.head_dim

    @property
    def matmul_params_per_layer(self) -> int:
        """Weights of one layer's matrix products: attention q and out (2 d^2), k and v (2 d kv_width),
        SwiGLU gate, up, down (3 d ffn_hidden). FLOPs and gradient bytes scale with these."""
        d = self.d_model
        return 2 * d * d + 2 * d * self.kv_width + 3 * d * self.ffn_hidden

    @property
    def params_per_layer(self) -> int:
        """Every parameter of one layer: the matrices, the two RMSNorm gains (d each) and the q, k, v
        biases where the model has them."""
        bias = self.d_model + 2 * self.kv_width if self.qkv_bias else 0
        return self.matmul_params_per_layer + 2 * self.d_model + bias

    @property
    def embed_params(self) -> int:
        """The token embedding table (vocab x d); the output head is a second table of the same size."""
        return self.vocab_size * self.d_model

    @property
    def n_params(self) -> int:
        """Every parameter of the model: layers, embedding, final RMSNorm gain and (untied) head."""
        return self.n_layers * self.params_per_layer + 2 * self.embed_params + self.d_model

    @property
    def layer_flops_per_token(self) -> int:
        """Forward FLOPs per token of one layer: 2 per matrix weight (multiply + add), plus attention
        scores and mixing over the full ``seq_len`` context (2 * 2 * seq_len * d); norms are negligible."""
        return 2 * self.matmul_params_per_layer + 4 * self.seq_len * self.d_model

    @property
    def flops_per_token(self) -> int:
        """Forward FLOPs per token of the whole model: every layer plus the output head (2 per weight)."""
        return self.n_layers * self.layer_flops_per_token + 2 * self.embed_params


class BatchSpec(_Section):
    tokens_per_step: int = Field(ge=1, le=2**40)  # global batch, summed over data-parallel replicas
    micro_batch_size: int = Field(ge=1, le=65536)  # sequences per pipeline micro-batch


class DataSpec(_Section):
    """Where tokens come from. Every peer reads the same source; replicas take disjoint sequences."""

    source: Literal["generated", "directory"] = "generated"
    path: str | None = Field(default=None, max_length=1024)  # directory of .txt/.jsonl/.parquet files
    generated_chars: int = Field(default=1_000_000, ge=1024, le=1 << 31)  # size of the built-in corpus
    tokenizer: str | None = Field(default=None, max_length=1024)  # HF tokenizers JSON; default bytes
    text_field: str = Field(default="text", min_length=1, max_length=256)  # .jsonl key, parquet/arrow column
    # SHA-256 of the shipped corpus's manifest (model/corpus): set by ``potluck launch`` for a directory
    # source of a pipeline job, which the peers then fetch over the swarm instead of reading a copy.
    fingerprint: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    shard_tokens: int = Field(default=1 << 22, ge=1024, le=1 << 26)  # tokens per shipped shard
    tokens: int | None = Field(default=None, ge=1, le=1 << 44)  # a shipped corpus's size, set by launch

    @model_validator(mode="after")
    def _directory_has_path(self) -> DataSpec:
        if self.source == "directory" and not self.path:
            raise ValueError("source = 'directory' needs `path` (a directory of .txt/.jsonl/.parquet files)")
        if self.path is not None and self.source == "generated":
            raise ValueError(
                "data.path is read only with source = 'directory' (the generated corpus has none)"
            )
        if self.fingerprint is not None and self.source != "directory":
            raise ValueError("data.fingerprint names a shipped directory: it needs source = 'directory'")
        return self

    @model_serializer(mode="wrap")
    def _omit_new_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out: dict[str, object] = handler(self)  # left out at their defaults: older releases sign without
        if out.get("text_field") == "text":
            del out["text_field"]
        if out.get("fingerprint", 0) is None:
            del out["fingerprint"]
        if out.get("shard_tokens") == 1 << 22:
            del out["shard_tokens"]
        if out.get("tokens", 0) is None:
            del out["tokens"]
        return out


class OptimizerSpec(_Section):
    """AdamW with linear warm-up, then cosine decay to ``min_lr_ratio * lr``; global-norm clipping."""

    lr: float = Field(default=3e-3, gt=0.0, le=10.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0.0, le=1.0)
    weight_decay: float = Field(default=0.1, ge=0.0, le=10.0)
    warmup_steps: int = Field(default=10, ge=0, le=10**9)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    clip_norm: float = Field(default=1.0, ge=0.0, le=1e6)  # 0 disables clipping


# CompressionSpec fields left out of the signed job at these defaults (older releases sign without them)
_LEFT_OUT_AT = (
    ("activations_slow", None),
    ("slow_link_gbps", 1.0),
    ("outer", None),
    ("outer_ef_decay", 1.0),
    ("outer_lr", 0.7),
    ("outer_momentum", 0.9),
    ("outer_overlap", True),
    ("outer_delay", None),
    ("auto", False),
)
AUTO = "auto"  # compression = "auto" in a job file: the coordinator chooses (CompressionSpec.auto)


class CompressionSpec(_Section):
    """Codecs on the wire (see docs/compression.md) and how often replicas synchronise."""

    activations: CodecSpec = Field(default="int8:block=64", min_length=1, max_length=256)
    gradients: CodecSpec = Field(default="int8:block=64", min_length=1, max_length=256)
    error_feedback: bool = True  # carry what the gradient codec dropped into the next step
    sync_every: int = Field(default=1, ge=1, le=10_000)  # H > 1: DiLoCo local steps between syncs
    # Selective activation compression (docs/compression.md, "Per-link activation codecs"): pipeline
    # transfers over a direction slower than ``slow_link_gbps`` (Gbit/s, as the planner measures it) use
    # this chain instead of ``activations``; the coordinator picks per link and signs it into the plan.
    # Both are left out of the signed job at their defaults, byte for byte what older releases sign.
    activations_slow: CodecSpec | None = Field(default=None, min_length=1, max_length=256)
    slow_link_gbps: float = Field(default=1.0, gt=0.0, le=1e6)
    # A codec chain for DiLoCo's pseudo-gradients (issue 22): each replica sends its coded pseudo-gradient
    # to the stage's other replicas (an all-gather) instead of the dense all-reduce with ``gradients``;
    # what the codec drops is carried to the next sync (error feedback, decayed by ``outer_ef_decay`` per
    # sync). Both are written only when set, so a job without them signs as releases without the fields.
    outer: CodecSpec | None = Field(default=None, min_length=1, max_length=256)
    outer_ef_decay: float = Field(default=1.0, ge=0.0, le=1.0)
    # DiLoCo's outer step for any job with sync_every > 1, coded or not: SGD with this lr on the mean
    # pseudo-gradient (1.0 adds it as is) and this Nesterov momentum. The defaults are DiLoCo's; left out
    # of the signed job at them, so older specs keep their hashes.
    outer_lr: float = Field(default=0.7, gt=0.0, le=10.0)
    outer_momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    # Streaming DiLoCo's overlap: the outer sync's exchange runs under the next inner step, and its
    # outer step lands at that step's end with what the step did carried over (peer/train/local.py).
    # False waits for the exchange at the sync, as DiLoCo does. Left out of the signed job when true.
    outer_overlap: bool = True
    # How many inner steps an overlapped exchange may run under before its outer step lands (Streaming
    # DiLoCo's tau), 1 to sync_every - 1. Unset: sync_every - 1 for an outer step without momentum (a
    # late average is still the average, and on a 5 Mbit/s uplink one sync's bytes need several steps'
    # spare upload), 1 with momentum (a Nesterov step delayed by half its period diverged at H = 2).
    # Left out of the signed job when unset.
    outer_delay: int | None = Field(default=None, ge=1, le=10_000)
    # compression = "auto" (what a job file without a [compression] section gets): the coordinator
    # chooses every setting above per plan from the measured links and signs its choice into the plan
    # (``TrainPlan.compression``; coordinator/job/autocomp.py). The fields keep their defaults, which only
    # a plan made before its links were measured uses. Left out of the signed job when false.
    auto: bool = False

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        for key, default in _LEFT_OUT_AT:
            if key in out and out[key] == default:
                del out[key]
        return out

    @model_validator(mode="after")
    def _outer_needs_local_steps(self) -> CompressionSpec:
        # by value: the signed job carries every field, each at its default when auto
        auto = _DEFAULTS if self.auto else {}
        changed = [k for k in auto if k != "auto" and getattr(self, k) != auto[k]]
        if changed:
            named = ", ".join(sorted(changed))
            raise ValueError(
                f"compression = 'auto' chooses every setting itself; remove {named}, or set them all "
                f"yourself without auto"
            )
        if self.outer is not None and self.sync_every < 2:
            raise ValueError(
                f"compression.outer codes DiLoCo pseudo-gradients: it needs compression.sync_every > 1 "
                f"(got {self.sync_every})"
            )
        if self.outer is None and self.outer_ef_decay != 1.0:
            raise ValueError("compression.outer_ef_decay applies to compression.outer, which is not set")
        if self.outer is not None and self.outer_ef_decay < 1.0 and self.outer_momentum != 0.9:
            # the decaying residual stands in for the outer momentum, which is then off (peer/train/outer.py)
            raise ValueError(
                f"compression.outer_momentum cannot be set with compression.outer_ef_decay < 1 "
                f"(got {self.outer_momentum} and {self.outer_ef_decay}): the decaying residual replaces "
                f"the outer momentum, which is then 0"
            )
        return self

    @property
    def outer_momentum_used(self) -> float:
        """The outer step's Nesterov momentum as it runs: none under a decaying residual, which plays
        its part (SparseLoCo; the validator refuses setting both)."""
        return 0.0 if self.outer is not None and self.outer_ef_decay < 1.0 else self.outer_momentum

    def landing_delay(self) -> int:
        """Inner steps an overlapped outer sync runs under before it lands (``outer_delay`` resolved):
        at least 1, at most sync_every - 1 (it lands before the next sync is due)."""
        most = max(1, self.sync_every - 1)
        if self.outer_delay is not None:
            return min(self.outer_delay, most)
        return most if self.outer_momentum_used == 0.0 else 1


_DEFAULTS = CompressionSpec().model_dump()  # what "auto" leaves every field at (see ``auto``)


class SyncSpec(_Section):
    """How a stage's replicas agree on each step's gradients (docs/training.md, "Stragglers").

    ``strict``: every replica contributes to every step; the slowest sets the pace. ``deadline``: the
    stage's round leader waits ``max(min_deadline_s, deadline_factor x its recent median compute time)``
    after its own gradients are ready; a replica not ready by then is left out of that step's mean and
    applies the committed mean afterwards; after ``max_misses`` misses in a row it is reported failed."""

    policy: Literal["strict", "deadline"] = "strict"
    deadline_factor: float = Field(default=1.0, gt=0.0, le=1000.0)  # x the median compute time per step
    min_deadline_s: float = Field(default=1.0, ge=0.0, le=3600.0)  # seconds; floor against jitter
    max_misses: int = Field(default=10, ge=1, le=10**6)  # consecutive missed steps before "failed"


class CheckpointSpec(_Section):
    dir: str = Field(default="checkpoints", min_length=1, max_length=1024)
    interval: int = Field(default=50, ge=1, le=10**9)  # steps between checkpoints
    keep: int = Field(default=3, ge=1, le=1000)  # complete checkpoints kept on disk


# How a stage's replicas' gradients are combined (peer/collectives/robust.py); the robust rules need a
# one-hop schedule, where each shard owner sees every replica's contribution unsummed.
AggregationRule = Literal["mean", "trimmed_mean", "centered_clip"]


class TrustSpec(_Section):
    """How far the job trusts its volunteers (docs/security.md).

    ``aggregation``: ``mean`` for a swarm of trusted peers; ``trimmed_mean`` or ``centered_clip`` where a
    minority may send poisoned gradients (each stage then all-reduces over one-hop trees). NaN or Inf
    contributions are refused under every rule."""

    aggregation: AggregationRule = "mean"
    trim: float = Field(default=0.2, ge=0.0, lt=0.5)  # trimmed_mean: share dropped from each side
    # An unmeasured peer's claimed TFLOP/s counts for at most this x the median claim (0: uncapped): a
    # lying peer cannot win most of the layers before its steps are measured (coordinator/job/claims.py)
    claim_cap: float = Field(default=2.0, ge=0.0, le=1000.0)
    # Pipeline spot checks (peer/train/checks/spot.py): the share of micro-batches that two other replicas of
    # the stage recompute, and the relative L2 error allowed beyond the activation codec's own
    spot_checks: float = Field(default=0.01, ge=0.0, le=1.0)
    spot_tolerance: float = Field(default=0.05, gt=0.0, le=10.0)


class LimitsSpec(_Section):
    """Bounds on the shape the planner may choose."""

    max_stages: int = Field(default=64, ge=1, le=1024)
    max_replicas: int = Field(default=1024, ge=1, le=100_000)
    stages: int | None = Field(default=None, ge=1, le=1024)  # force a pipeline depth
    replicas: int | None = Field(default=None, ge=1, le=100_000)  # force a data-parallel width


JobKind = Literal["pipeline", "class_parallel"]
# A class-parallel job trains no transformer: its [model] and [batch] may be left out, and stand for
# this smallest valid one (nothing reads them; the planner's code paths stay typed as they are).
_UNUSED_MODEL = {"n_layers": 1, "d_model": 8, "n_heads": 1, "vocab_size": 2, "seq_len": 2}
_UNUSED_BATCH = {"tokens_per_step": 2, "micro_batch_size": 1}


class JobSpec(Record):
    """What the coordinator is asked to train. Signed by the coordinator, stored under the job key.

    ``kind``: "pipeline" (a transformer over pipeline stages and replicas) or "class_parallel" (the
    ``[class_parallel]`` section: sub-networks per class group, docs/class-parallel.md). A pipeline
    job's record is written without the two fields, byte for byte what releases without them sign."""

    KIND: ClassVar[str] = "JobSpec"

    name: Name
    kind: JobKind = "pipeline"
    class_parallel: ClassParSpec | None = None
    seed: int = Field(default=0, ge=0, lt=2**63)
    steps: int = Field(default=100, ge=1, le=10**9)
    min_peers: int = Field(default=1, ge=1, le=100_000)
    model: ModelSpec
    batch: BatchSpec
    data: DataSpec = Field(default_factory=DataSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    compression: CompressionSpec = Field(default_factory=CompressionSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    sync: SyncSpec = Field(default_factory=SyncSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    trust: TrustSpec = Field(default_factory=TrustSpec)

    @model_validator(mode="before")
    @classmethod
    def _class_parallel_needs_no_model(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("kind") == "class_parallel":
            data = dict(data)
            data.setdefault("model", _UNUSED_MODEL)
            data.setdefault("batch", _UNUSED_BATCH)
            data.setdefault("class_parallel", {})
        return data

    @model_serializer(mode="wrap")
    def _omit_pipeline_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        if out.get("kind") == "pipeline":
            del out["kind"]
        if out.get("class_parallel", 0) is None:
            del out["class_parallel"]
        return out

    @model_validator(mode="after")
    def _class_parallel_section(self) -> JobSpec:
        if self.kind == "pipeline" and self.class_parallel is not None:
            raise ValueError("a [class_parallel] section needs kind = 'class_parallel'")
        if self.kind == "class_parallel":
            assert self.class_parallel is not None  # filled in before validation
            spec = self.class_parallel
            if self.data.source == "directory" and spec.classes is None:
                raise ValueError(
                    "a class-parallel job on an image folder (data.source = 'directory') needs "
                    "class_parallel.classes: the number of class subdirectories every peer's copy holds"
                )
            if self.data.source == "generated" and spec.classes not in (None, NUM_GENERATED_CLASSES):
                raise ValueError(f"the procedural image set has {NUM_GENERATED_CLASSES} classes")
            spec.check_classes(spec.num_classes)
        return self

    @model_validator(mode="after")
    def _batch_holds_sequences(self) -> JobSpec:
        if self.batch.tokens_per_step % self.model.seq_len:
            raise ValueError(
                f"batch.tokens_per_step ({self.batch.tokens_per_step}) must be a multiple of "
                f"model.seq_len ({self.model.seq_len})"
            )
        if self.limits.stages is not None and self.limits.stages > self.model.n_layers:
            raise ValueError(f"limits.stages ({self.limits.stages}) exceeds model.n_layers")
        comp = self.compression
        if self.sync.policy == "deadline" and comp.sync_every > 1 and comp.outer is None:
            # the dense outer all-reduce has no deadline; the coded one does: a replica left out of an
            # outer sync keeps its payload in its residual (peer/collectives/partial.py)
            raise ValueError(
                f"sync.policy = 'deadline' with DiLoCo local steps (compression.sync_every = "
                f"{comp.sync_every}) needs compression.outer: its deadline is on the coded outer sync"
            )
        if self.compression.outer is not None and self.trust.aggregation == "centered_clip":
            # every replica aggregates the gathered payloads itself and must land on the same bits;
            # centered clipping's norms are reductions whose order may differ between CPUs
            raise ValueError(
                "compression.outer combines by trust.aggregation = 'mean' or 'trimmed_mean' "
                "(got 'centered_clip')"
            )
        return self

    @property
    def sequences_per_step(self) -> int:
        return self.batch.tokens_per_step // self.model.seq_len


# Reading a job file (TOML) into a ``JobSpec``, with errors that name the offending field.
MAX_JOB_FILE_BYTES = 1 << 20


def load_job(path: Path) -> JobSpec:
    """Parse and validate ``path``; raise ``JobSpecError`` naming the file and field on any problem.
    (A job ``from`` a Hugging Face directory is read with ``potluck.model.hub.config.load_job_file``,
    which fills its shape in from that directory first.)"""
    return parse_job(read_job_file(path), source=str(path))


def owner_path(job_dir: Path, name: str) -> Path:
    """A path a job file names (a model directory, a data folder, a tokenizer) as the job owner's
    machine reads it: relative to the job file's directory ``job_dir``, ``~`` expanded."""
    path = Path(name).expanduser()
    return path if path.is_absolute() else job_dir / path


def read_job_file(path: Path) -> dict[str, object]:
    """A job file's TOML as a dict, bounded in size; ``JobSpecError`` when unreadable or not TOML."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise JobSpecError(f"cannot read job file {path}: {e.strerror}") from None
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise JobSpecError(f"job file {path} is larger than {MAX_JOB_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise JobSpecError(f"job file {path} is not valid TOML: {e}") from None
    return data


def parse_job(data: dict[str, object], source: str = "job") -> JobSpec:
    """A job file's contents as a ``JobSpec``. Without a ``[compression]`` section (or with
    ``compression = "auto"``) the coordinator chooses the compression from the measured links
    (``CompressionSpec.auto``); a section keeps exactly the settings it names."""
    if data.get("compression", AUTO) == AUTO:
        data = {**data, "compression": {"auto": True}}
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"{source}: field `{where}`: {err['msg']}")
        raise JobSpecError("\n".join(lines)) from None
