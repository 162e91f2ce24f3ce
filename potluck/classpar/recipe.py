"""A class-parallel job's recipe on one machine: the steps a swarm peer runs, from the job's section.

Everything is seeded from the job's seed, so any peer that trains the teacher gets the same one, and
the coordinator can group from any copy of its features. Models travel as bytes (``to_bytes``: a
``torch.save`` of widths, outputs, classes and the state dict; read back with ``weights_only=True``, so
a hostile blob cannot run code) named by their SHA-256. ``worker_reply`` is what a serving peer
answers for one coded worker: a group's float32 scores (systematic) or a parity row's combination of
its support's scores in float64.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from potluck.classpar import code as codes
from potluck.classpar import data, merge, model, subnet
from potluck.classpar.errors import ClassParallelError
from potluck.classpar.folder import folder_sets
from potluck.protocol.classpar import ClassParSpec

logger = logging.getLogger(__name__)

VAL_PER_CLASS = 20  # held-out procedural images per class for the accuracies records report
MAX_BLOB_BYTES = 64 << 20  # largest serialized model a peer fetches


@dataclass
class Unit:
    """A sub-network a peer holds: its model, group, serialization and figures."""

    subnet: subnet.Subnet
    blob: bytes
    sha256: str
    val_accuracy: float


def sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def job_data(spec: ClassParSpec, seed: int, folder: str | None = None) -> tuple[data.ImageSet, data.ImageSet]:
    """The training set every peer reads and a small validation set: procedural from ``seed``, or split
    from this machine's copy of the job's image ``folder`` (``folder.folder_sets``: checked against the
    owner's digest)."""
    if spec.classes is None:
        return data.train_test(spec.train_per_class, VAL_PER_CLASS, seed)
    if folder is None:
        raise ClassParallelError("this job reads an image folder: give the peer its copy (--data-dir)")
    return folder_sets(folder, spec.classes, seed, spec.data_sha256)


def make_code(kind: str, units: int, parity: int) -> codes.ErasureCode:
    """The serving code of a plan: systematic Cauchy or one parity per group of units; uncoded (the
    identity) without parity."""
    if parity == 0:
        return codes.ErasureCode(np.eye(units))
    if kind == "cauchy":
        return codes.systematic_cauchy(units, parity)
    if kind == "group":
        return codes.group_parity(units, parity)
    raise ClassParallelError(f"unknown code {kind!r}")


def to_bytes(net: model.SmallCNN, group: Sequence[int]) -> bytes:
    buf = io.BytesIO()
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    torch.save(
        {"widths": list(net.widths), "outputs": net.num_outputs, "group": list(group), "state": state}, buf
    )
    return buf.getvalue()


def from_bytes(blob: bytes) -> tuple[model.SmallCNN, list[int]]:
    """A model and its classes back from ``to_bytes``; ``ClassParallelError`` if the blob is not one."""
    if len(blob) > MAX_BLOB_BYTES:
        raise ClassParallelError(f"model blob of {len(blob)} bytes exceeds {MAX_BLOB_BYTES}")
    try:
        obj = torch.load(io.BytesIO(blob), weights_only=True)
        widths = [int(w) for w in obj["widths"]]
        if not 1 <= len(widths) <= 8 or any(not 1 <= w <= 4096 for w in widths):
            raise ValueError(f"widths {widths}")
        net = model.SmallCNN(widths, int(obj["outputs"]))
        net.load_state_dict(obj["state"])
        group = [int(c) for c in obj["group"]]
    except Exception as e:  # a blob from the network: any failure means "not a model"
        raise ClassParallelError(f"not a serialized class-parallel model: {e}") from None
    net.eval()
    return net, group


def train_teacher(
    spec: ClassParSpec, seed: int, folder: str | None = None
) -> tuple[model.SmallCNN, np.ndarray, float]:
    """The teacher, its mean penultimate features per class (K, d) and its validation accuracy."""
    train, val = job_data(spec, seed, folder)
    torch.manual_seed(seed)
    teacher = model.SmallCNN(spec.widths, train.num_classes)
    model.fit(teacher, train.x, train.y, epochs=spec.teacher_epochs, seed=seed)
    feats = model.mean_class_features(teacher, train.x, train.y, train.num_classes).numpy()
    acc = merge.accuracy(model.predict(teacher, val.x), val.y)
    logger.info("teacher trained: validation accuracy %.3f", acc)
    return teacher, feats, acc


def build_unit(
    teacher: model.SmallCNN,
    spec: ClassParSpec,
    seed: int,
    groups: Sequence[Sequence[int]],
    unit: int,
    folder: str | None = None,
) -> Unit:
    """Group ``unit``'s sub-network: pruned from ``teacher`` and retrained, with its validation accuracy
    (of its (|g|+1)-way output on every validation image)."""
    train, _ = job_data(spec, seed, folder)
    budget = None
    if spec.macs_budget is not None:
        budget = spec.macs_budget * model.model_macs(teacher) / len(groups)
    built = subnet.build_subnet(
        teacher,
        train,
        groups[unit],
        threshold=spec.apoz_threshold,
        macs_budget=budget,
        k=spec.oversample_k,
        distill=spec.distill,
        epochs=spec.retrain_epochs,
        seed=seed * 1000 + unit,
    )
    acc = group_accuracy(built.model, built.group, spec, seed, folder)
    blob = to_bytes(built.model, built.group)
    return Unit(built, blob, sha256(blob), acc)


def group_accuracy(
    net: model.SmallCNN, group: Sequence[int], spec: ClassParSpec, seed: int, folder: str | None = None
) -> float:
    """A sub-network's (|g|+1)-way accuracy on the job's validation images (0 = not in ``group``); for
    the K-way teacher, its softmax folded the same way (the group's classes, the rest summed)."""
    _, val = job_data(spec, seed, folder)
    members = sorted(int(c) for c in group)
    probs = model.predict(net, val.x)
    if net.num_outputs != len(members) + 1:
        inside = probs[:, members]
        probs = torch.cat([(1.0 - inside.sum(dim=1, keepdim=True)).clamp_min(0.0), inside], dim=1)
    return float((probs.argmax(dim=1) == subnet.relabel(val.y, members)).double().mean())


def load_unit(blob: bytes, expected_sha256: str, group: Sequence[int]) -> Unit:
    """A unit fetched from another peer: checked against the hash its record names and its group."""
    digest = sha256(blob)
    if digest != expected_sha256:
        raise ClassParallelError(f"model blob hash {digest[:12]} is not the {expected_sha256[:12]} named")
    net, classes = from_bytes(blob)
    if classes != sorted(int(c) for c in group) or net.num_outputs != len(classes) + 1:
        raise ClassParallelError(f"the blob scores classes {classes}, not group {sorted(group)}")
    return Unit(subnet.Subnet(net, classes, model.model_macs(net)), blob, digest, 0.0)


def worker_reply(
    code: codes.ErasureCode, worker: int, units: Mapping[int, Unit], x: torch.Tensor
) -> np.ndarray:
    """Coded worker ``worker``'s reply for images ``x``: (N, |g|) float32 for a systematic row, the
    generator row's combination of its support's scores in float64 otherwise."""
    row = code.generator[worker]
    support = code.support(worker)
    missing = [u for u in support if u not in units]
    if missing:
        raise ClassParallelError(f"worker {worker} needs units {missing}, not held here")
    if len(support) == 1 and row[support[0]] == 1.0:
        return merge.group_scores(units[support[0]].subnet, x).numpy()
    total: np.ndarray | None = None
    for u in support:
        part = row[u] * merge.group_scores(units[u].subnet, x).numpy().astype(np.float64)
        total = part if total is None else total + part
    assert total is not None
    return total
