"""One pipeline stage's compute: forward and backward of micro-batches, gradients, the optimizer step.

No networking and no event loop here: the pipeline executor calls these methods from a worker thread
and moves tensors between peers itself. The same class runs the single-process reference (one stage
holding every layer), which is what makes "the swarm equals one big machine" a testable claim.

Loss scaling: micro-batch m's loss is its mean token cross-entropy times ``weight`` (its share of the
sequences the gradient should average over). Summing weighted gradients over micro-batches, and over
replicas with a SUM all-reduce, gives exactly the gradient of the global batch's mean loss, even when
replicas or micro-batches hold different numbers of sequences.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from potluck.model.bottleneck import boundary_of
from potluck.model.device import autocast, autocast_dtype
from potluck.model.optim import build_optimizer
from potluck.model.staging import Staging
from potluck.model.transformer import StageModel
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec

logger = logging.getLogger(__name__)


@dataclass
class _InFlight:
    inputs: torch.Tensor | None  # received hidden states (requires grad); None on the first stage
    output: torch.Tensor  # this stage's output, or the weighted loss on the last stage


@dataclass
class StageRunner:
    spec: ModelSpec
    first: int
    last: int
    seed: int
    optimizer_spec: OptimizerSpec
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # "auto": bf16 autocast on CUDA, fp32 elsewhere; "bf16": autocast on any device; "fp32": never
    precision: str = "auto"
    # the job's bottleneck positions (TrainPlan.bottleneck_cuts, model/bottleneck.py); None: this
    # stage's own ends, as under a plan that names none
    cuts: tuple[int, ...] | None = None
    # its state is loaded before it trains (``load_state_tensors``): built ``StageModel.unset``, so the
    # weights take memory once, as the state that arrives, not also as a seeded draw
    unset: bool = False

    def __post_init__(self) -> None:
        if self.unset:
            self.model = StageModel.unset(self.spec, self.first, self.last, self.seed, self.cuts, self.device)
        else:
            self.model = StageModel(self.spec, self.first, self.last, self.seed, self.cuts).to(self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, self.optimizer_spec)
        self._live: dict[int, _InFlight] = {}
        # Overlap hook: during the backward of micro-batch ``final_micro`` (the step's last), every
        # parameter whose gradient is final is announced as ``on_grad_ready(index)`` from the compute
        # thread, so its bucket's all-reduce can start while earlier layers are still in backward.
        self.final_micro: int | None = None
        self.on_grad_ready: Callable[[int], None] | None = None
        self._in_final = False
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda _p, i=i: self._grad_done(i))
        # bf16 autocast of forward and backward (model/device.py); master weights and AdamW stay fp32
        self.autocast = autocast_dtype(self.device, self.precision)
        precision = "bf16 autocast" if self.autocast is not None else "fp32"
        logger.info("layers [%d, %d) on %s in %s", self.first, self.last, self.device, precision)
        # pinned host buffers and a side stream for tensors crossing to and from the wire (CUDA only)
        self.staging = Staging(self.device)

    @property
    def is_first(self) -> bool:
        return self.model.is_first

    @property
    def is_last(self) -> bool:
        return self.model.is_last

    def _cast(self, device: torch.device | None = None) -> contextlib.AbstractContextManager[object]:
        """Autocast for a model on ``device`` (the stage's): a replay on a CPU copy of a GPU stage's
        weights runs in fp32 unless the stage asked for bf16 everywhere."""
        device = self.device if device is None else device
        dtype = self.autocast if device.type == self.device.type else autocast_dtype(device, self.precision)
        return autocast(device, dtype)

    # ---- micro-batches -------------------------------------------------------------------------------

    @property
    def needs_tokens(self) -> bool:
        """Whether micro-batches must bring their token ids to this stage (not the first) as ``tokens``:
        it re-embeds them at a bottleneck (``model.bottleneck_tokens``)."""
        return self.model.needs_tokens

    def forward(
        self,
        m: int,
        inputs: torch.Tensor,
        targets: torch.Tensor | None = None,
        weight: float = 1.0,
        tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run micro-batch ``m``. Returns the activations to send on, or (last stage) the unweighted
        mean loss as a 0-d tensor. Keeps what the backward needs until ``backward(m)``. ``tokens``: the
        micro-batch's ids, for a stage that ``needs_tokens``."""
        x = self.staging.to_device(inputs)
        if not self.is_first:
            x = x.detach().requires_grad_(True)
        ids = self.staging.to_device(tokens) if tokens is not None else None
        with self._cast():
            out = self.model(x, ids)
        if self.is_last:
            if targets is None:
                raise ValueError("the last stage needs targets")
            loss = StageModel.loss(out, self.staging.to_device(targets))
            self._live[m] = _InFlight(None if self.is_first else x, loss * weight)
            return loss.detach()
        self._live[m] = _InFlight(None if self.is_first else x, out)
        return out.detach()

    def _grad_done(self, index: int) -> None:
        if self._in_final and self.on_grad_ready is not None:
            self.on_grad_ready(index)

    def backward(self, m: int, grad_output: torch.Tensor | None = None) -> torch.Tensor | None:
        """Backward of micro-batch ``m`` (accumulating parameter gradients). Returns the gradient of the
        stage's input to send back, or None on the first stage."""
        live = self._live.pop(m)
        if not self.is_last and grad_output is None:
            raise ValueError("a stage before the last needs the gradient of its output")
        self._in_final = m == self.final_micro
        try:
            if self.is_last:
                live.output.backward()
            else:
                assert grad_output is not None
                live.output.backward(self.staging.to_device(grad_output, live.output.dtype))
        finally:
            self._in_final = False
        if live.inputs is None:
            return None
        assert live.inputs.grad is not None
        return live.inputs.grad

    # ---- spot checks: one micro-batch again, on a copy of the weights ----------------------------------

    def frozen_copy(self, on_cpu: bool | None = None) -> StageModel:
        """The stage's weights as they are now, apart from the live model (which goes on training). On
        the CPU when the stage runs on a GPU (``on_cpu`` None): a home GPU has no room for a second copy,
        and a replay is one micro-batch now and then."""
        if not (self.device.type != "cpu" if on_cpu is None else on_cpu):
            model = copy.deepcopy(self.model)  # parameter hooks are not copied: no overlap callbacks
        else:  # no initialisation work, no memory but the copy: the weights come next
            model = StageModel.unset(
                self.spec, self.first, self.last, self.seed, self.cuts, torch.device("cpu")
            )
            model.load_state_dict({k: v.detach().cpu() for k, v in self.model.state_dict().items()})
        model.requires_grad_(False)
        return model

    def replay(
        self,
        model: StageModel,
        inputs: torch.Tensor,
        targets: torch.Tensor | None = None,
        weight: float = 1.0,
        grad_output: torch.Tensor | None = None,
        tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Micro-batch forward (and backward) on ``model`` exactly as ``forward``/``backward`` run it:
        (the output sent on, None on the last stage; the input gradient sent back, None on the first
        stage or without ``grad_output`` before the last)."""
        backward = not self.is_first and (self.is_last or grad_output is not None)
        device = next(model.parameters()).device  # the copy's: the CPU for a GPU stage (fp32 there)
        x = inputs.to(device)
        if not self.is_first:
            x = x.detach().requires_grad_(backward)
        ids = tokens.to(device) if tokens is not None else None
        with torch.set_grad_enabled(backward):
            with self._cast(device):
                out = model(x, ids)
            if self.is_last:
                if targets is None:
                    raise ValueError("the last stage needs targets")
                (StageModel.loss(out, targets.to(device)) * weight).backward()
                return None, x.grad
            if backward:
                assert grad_output is not None
                out.backward(grad_output.to(device, out.dtype))
        return out.detach(), x.grad if backward else None

    def recompute_gradients(
        self, model: StageModel, batches: list[tuple[torch.Tensor, torch.Tensor, float]]
    ) -> list[torch.Tensor]:
        """The parameter gradients (in ``params`` order) a whole-model stage accumulates over ``batches``
        of (inputs, targets, weight) on ``model``, a copy of its weights (``frozen_copy``): what a
        replica whose step ran on those weights should have contributed. The copy is used up (its
        parameters now require and hold gradients)."""
        if not (self.is_first and self.is_last):
            raise ValueError("recomputing a step's gradients needs a stage holding every layer")
        named = dict(model.named_parameters())
        params = [named[n] for n in self.names]
        for p in params:
            p.requires_grad_(True)
            p.grad = None
        device = params[0].device
        for inputs, targets, weight in batches:
            with self._cast(device):
                out = model(inputs.to(device))
            (StageModel.loss(out, targets.to(device)) * weight).backward()
        return [p.grad.detach() if p.grad is not None else torch.zeros_like(p) for p in params]

    @property
    def in_flight(self) -> int:
        return len(self._live)

    # ---- gradients and the step --------------------------------------------------------------------------

    @property
    def grad_vector_len(self) -> int:
        """Elements of ``grad_vector()``: what a replica's gradient payload must hold."""
        return sum(p.numel() for p in self.params)

    def grad_vector(self) -> torch.Tensor:
        """All parameter gradients as one flat fp32 vector (zeros where a parameter got none)."""
        return torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in self.params]
        )

    def set_grad_vector(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.device, p.dtype).clone()
            offset += n
        if offset != flat.numel():
            raise ValueError(f"gradient vector has {flat.numel()} elements, the stage {offset}")

    def grad_sq_norm(self) -> float:
        """Squared L2 norm of this stage's gradients (the global norm is the root of the sum over stages)."""
        sums = [p.grad.float().pow(2).sum() for p in self.params if p.grad is not None]
        # one device sync for all of them (a float() each would stall a GPU stage once per parameter);
        # the same fp32 sums added in the same order as doubles: a CPU stage's result is unchanged
        return float(sum(torch.stack(sums).tolist())) if sums else 0.0

    def step(self, lr: float, clip_coef: float = 1.0) -> None:
        """Scale gradients by ``clip_coef``, take one AdamW step at ``lr``, clear gradients."""
        with torch.no_grad():
            if clip_coef != 1.0:
                for p in self.params:
                    if p.grad is not None:
                        p.grad.mul_(clip_coef)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.zero_grad()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._live.clear()

    # ---- checkpoint state ----------------------------------------------------------------------------

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Weights under "model.", AdamW moments and step counts under "optim.<param name>."."""
        out = {f"model.{k}": v.detach().cpu() for k, v in self.model.state_dict().items()}
        for name, p in zip(self.names, self.params, strict=True):
            st = self.optimizer.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq", "step"):
                if key in st:
                    out[f"optim.{name}.{key}"] = torch.as_tensor(st[key]).detach().cpu().reshape(-1)
        return out

    def _take(self, weights: dict[str, torch.Tensor], take: bool) -> None:
        """``load_state_dict(weights, strict=True)``; with ``take``, each tensor already of the
        parameter's dtype and device becomes its storage instead of being copied into it, so the state
        is in memory once (the optimizer and the hooks hold the same ``Parameter`` objects). Only for
        tensors nothing else holds: the stage trains them in place."""
        own = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        expected = set(self.model.state_dict())
        missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
        if missing or unexpected:
            raise RuntimeError(
                f"state does not fit the stage: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        with torch.no_grad():
            for name, tensor in weights.items():
                target = own[name]
                if tensor.shape != target.shape:
                    raise RuntimeError(
                        f"{name}: saved {tuple(tensor.shape)}, the stage has {tuple(target.shape)}"
                    )
                if tensor is target:
                    continue
                same = tensor.dtype == target.dtype and tensor.device == target.device
                if take and same and tensor.is_contiguous():
                    target.data = tensor
                else:
                    target.copy_(tensor)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], take: bool = False) -> None:
        """Restore what ``state_tensors`` saved (``take``: as this stage's own storage where it can, for
        tensors the caller made for it alone: ``_take``); strict about missing and unexpected weights, except
        bottleneck maps at positions the saved stages and this one disagree on (state saved under
        positions chosen afresh, say by a coordinator that lost its memory): a map this stage lacks is
        dropped, one it has that was not saved keeps its identity init, each with a warning."""
        weights = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
        own = self.model.state_dict()
        fresh = [k for k in own if k not in weights and boundary_of(f"model.{k}")]
        if fresh:
            logger.warning("no saved bottleneck maps %s: they start from the identity init", fresh)
            if self.unset:  # built without its draw: draw it now, the loaded weights then replace it
                self.model.init()
            weights |= {k: own[k] for k in fresh}
        foreign = [k for k in weights if k not in own and boundary_of(f"model.{k}")]
        foreign = foreign if self.spec.bottleneck_rank is not None else []  # strict without a bottleneck
        if foreign:
            logger.warning("saved bottleneck maps %s are at no position of this stage: dropped", foreign)
            weights = {k: v for k, v in weights.items() if k not in foreign}
        self._take(weights, take)
        self.unset = False
        for name, p in zip(self.names, self.params, strict=True):
            keys = {key: tensors.get(f"optim.{name}.{key}") for key in ("exp_avg", "exp_avg_sq", "step")}
            if any(v is None for v in keys.values()):
                continue  # saved before the first step: no moments yet
            assert keys["exp_avg"] is not None and keys["exp_avg_sq"] is not None and keys["step"] is not None
            moments = (keys["exp_avg"], keys["exp_avg_sq"])
            adopt = take and all(
                t.dtype == p.dtype and t.device == p.device and t.is_contiguous() for t in moments
            )
            avg, sq = (t.view_as(p) if adopt else t.view_as(p).to(p.device).clone() for t in moments)
            self.optimizer.state[p] = {
                "step": keys["step"].reshape(()).clone().float(),
                "exp_avg": avg,
                "exp_avg_sq": sq,
            }
