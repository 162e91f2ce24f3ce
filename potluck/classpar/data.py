"""Image data for class-parallel jobs: a procedural 10-class set (no downloads) and image folders.

The procedural set is 16 x 16 greyscale: class ``c`` is an oriented pattern, orientation
``(c % 5) * 36`` degrees (jittered by up to 6 degrees), kind ``c // 5`` (0: a sinusoidal grating of 2 to
3.5 cycles per image with a random phase, 1: a single bar 2 pixels wide at a random offset), at a random
contrast under Gaussian noise. Neighbouring orientations and the two kinds at one orientation are the
confusable pairs, so grouping by features has something to find. Everything comes from one seeded
generator: the same seed gives the same bytes on every machine.

``load_image_folder`` reads any ``root/<class>/<image>`` tree (``.npy`` arrays, binary PGM/PPM, and PNG
or JPEG when Pillow is installed), resized to ``size x size`` greyscale.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from potluck.classpar.errors import ImageFolderError

try:  # Pillow is optional: without it only .npy and netpbm files are read
    from PIL import Image as _PILImage
except ImportError:  # pragma: no cover - depends on the environment
    _PILImage = None  # type: ignore[assignment, unused-ignore]

logger = logging.getLogger(__name__)

NUM_CLASSES = 10
SIDE = 16  # pixels
_ORIENTATIONS = 5
_JITTER_DEG = 6.0
_NOISE_STD = 1.0  # relative to a contrast of about 1
IMAGE_SUFFIXES = {".npy", ".pgm", ".ppm", ".png", ".jpg", ".jpeg"}


@dataclass(frozen=True)
class ImageSet:
    """Images ``x`` (N, 1, H, W) float32 and labels ``y`` (N,) int64 in ``0..num_classes-1``."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    class_names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, index: torch.Tensor) -> ImageSet:
        """The images at ``index`` (a long tensor), same classes."""
        return ImageSet(self.x[index], self.y[index], self.num_classes, self.class_names)


def _pattern(rng: np.random.Generator, cls: int) -> np.ndarray:
    theta = math.radians(
        (cls % _ORIENTATIONS) * 180.0 / _ORIENTATIONS + rng.uniform(-_JITTER_DEG, _JITTER_DEG)
    )
    coords = np.arange(SIDE, dtype=np.float64) - (SIDE - 1) / 2.0
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    # distance along the pattern's normal, in pixels
    u = xx * math.cos(theta) + yy * math.sin(theta)
    if cls // _ORIENTATIONS == 0:
        cycles = rng.uniform(2.0, 3.5)
        img = np.sin(2.0 * math.pi * cycles * u / SIDE + rng.uniform(0.0, 2.0 * math.pi))
    else:
        offset = rng.uniform(-SIDE / 4.0, SIDE / 4.0)
        img = np.where(np.abs(u - offset) <= 1.0, 1.0, -0.25)
    return img * rng.uniform(0.4, 1.0)


def procedural(n_per_class: int, seed: int) -> ImageSet:
    """``n_per_class`` images of each of the 10 classes, interleaved by class, from ``seed``."""
    rng = np.random.default_rng(seed)
    n = n_per_class * NUM_CLASSES
    x = np.empty((n, 1, SIDE, SIDE), dtype=np.float32)
    y = np.empty(n, dtype=np.int64)
    for i in range(n):
        cls = i % NUM_CLASSES
        x[i, 0] = _pattern(rng, cls) + rng.normal(0.0, _NOISE_STD, (SIDE, SIDE))
        y[i] = cls
    names = tuple(
        f"{'grating' if c < _ORIENTATIONS else 'bar'}-{c % _ORIENTATIONS * 36}deg" for c in range(10)
    )
    return ImageSet(torch.from_numpy(x), torch.from_numpy(y), NUM_CLASSES, names)


def train_test(
    n_train_per_class: int = 500, n_test_per_class: int = 200, seed: int = 0
) -> tuple[ImageSet, ImageSet]:
    """A training and a test set from disjoint seeds derived from ``seed``."""
    return procedural(n_train_per_class, 2 * seed + 1), procedural(n_test_per_class, 2 * seed + 2)


def _read_netpbm(path: Path) -> np.ndarray:
    data = path.read_bytes()
    fields: list[bytes] = []
    pos = 0
    while len(fields) < 4:  # magic, width, height, maxval; '#' comments allowed between them
        while pos < len(data) and data[pos : pos + 1].isspace():
            pos += 1
        if data[pos : pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1
            continue
        start = pos
        while pos < len(data) and not data[pos : pos + 1].isspace():
            pos += 1
        fields.append(data[start:pos])
    pos += 1  # the single whitespace byte before the raster
    magic, width, height, maxval = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    if magic not in (b"P5", b"P6") or maxval > 255:
        raise ImageFolderError(f"{path}: only binary 8-bit PGM (P5) and PPM (P6) are read")
    channels = 1 if magic == b"P5" else 3
    raster = np.frombuffer(data, dtype=np.uint8, count=width * height * channels, offset=pos)
    return raster.reshape(height, width, channels).astype(np.float32) / maxval


def _read_image(path: Path) -> np.ndarray:
    """One image as (H, W) float32 greyscale."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        arr = np.load(path, allow_pickle=False).astype(np.float32)
    elif suffix in (".pgm", ".ppm"):
        arr = _read_netpbm(path)
    elif _PILImage is not None:
        with _PILImage.open(path) as img:
            arr = np.asarray(img.convert("L"), dtype=np.float32) / 255.0
    else:
        raise ImageFolderError(f"{path}: reading {suffix} needs Pillow; use .npy or PGM, or install Pillow")
    if arr.ndim == 3:  # H, W, C -> grey
        arr = arr.mean(axis=2)
    if arr.ndim != 2:
        raise ImageFolderError(f"{path}: expected a 2-D or 3-D array, got shape {arr.shape}")
    return arr


def image_files(root: str | Path) -> list[tuple[Path, list[Path]]]:
    """Each class folder under ``root`` (sorted) with its image files (sorted): what an image folder
    holds, as ``load_image_folder`` reads it and ``folder.folder_digest`` hashes it."""
    base = Path(root)
    classes = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if len(classes) < 2:
        raise ImageFolderError(f"{base}: need at least two class subdirectories")
    out: list[tuple[Path, list[Path]]] = []
    for folder in classes:
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ImageFolderError(f"{folder}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        out.append((folder, files))
    return out


def load_image_folder(root: str | Path, size: int = SIDE) -> ImageSet:
    """Every image under ``root/<class>/``, classes in sorted directory order, standardized."""
    base = Path(root)
    classes = image_files(base)
    xs: list[torch.Tensor] = []
    ys: list[int] = []
    for label, (_, files) in enumerate(classes):
        for path in files:
            img = torch.from_numpy(_read_image(path))[None, None]
            xs.append(F.interpolate(img, size=(size, size), mode="bilinear", align_corners=False)[0])
            ys.append(label)
    x = torch.stack(xs)
    x = (x - x.mean()) / x.std().clamp_min(1e-6)
    logger.info("read %d images of %d classes from %s", len(ys), len(classes), base)
    names = tuple(folder.name for folder, _ in classes)
    return ImageSet(x.contiguous(), torch.tensor(ys, dtype=torch.int64), len(classes), names)
