"""The self-describing payload format (see docs/wire-format.md). All integers are little-endian.

A payload is ``header | spec | payload | checksum``:

    offset size  field
    0      4     magic b"PLKC"
    4      1     format version (2; version 1 is still read)
    5      1     dtype code of the original tensor (DTYPE_CODES)
    6      1     ndim (0..16)
    7      1     flags: bit0 = a key was given
    8      2     spec length S in bytes (ASCII, canonical codec spec)
    10     2     reserved, 0
    12     4     payload length P in bytes
    16     8     key (u64; 0 when no key)
    24     8*nd  dims, u64 each
    ..     S     spec
    ..     P     payload: section table + sections
    ..     4     checksum of every byte before it: CRC32C (Castagnoli) in version 2, zlib's CRC32 in
                 version 1. The two versions differ only in this trailer (and the version byte).

The payload is ``u8 count`` then, per section, ``u8 width, u8 flags, u32 raw_len, u32 stored_len``,
then the sections' stored bytes in order. ``width`` is the element size used for byte shuffling;
flags bit0 = zstd-compressed (stored bytes are the zstd frame of the byte-shuffled raw bytes).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from potluck.compression.checksum import crc32, crc32c
from potluck.compression.errors import DecodeError, EncodeError

MAGIC = b"PLKC"
VERSION = 2  # the newest format, written by default
VERSIONS = (1, 2)  # what we read, and can write for older peers (pack(..., version=1))


def write_version() -> int:
    """The version encoders write when the caller names none: ``POTLUCK_WIRE_VERSION`` (1 or 2), else
    the newest. A swarm upgrades in two steps: every peer first runs a build that reads both versions
    while writing 1, then the variable is dropped (docs/wire-format.md)."""
    raw = os.environ.get("POTLUCK_WIRE_VERSION", "").strip()
    if not raw:
        return VERSION
    if raw not in {str(v) for v in VERSIONS}:
        raise EncodeError(f"POTLUCK_WIRE_VERSION={raw!r}: must be one of {VERSIONS}")
    return int(raw)


_FIXED = struct.Struct("<4sBBBBHHIQ")
FIXED_SIZE = _FIXED.size  # 24 bytes
_SECTION = struct.Struct("<BBII")
CRC_SIZE = 4
MAX_NDIM = 16
MAX_SPEC_LEN = 1024
MAX_SECTIONS = 16
# Default cap on the element count a header may declare (2^32 elements = 16 GiB of fp32). Larger
# tensors must be split into parts (the key has a part field). Decoders may lower it.
MAX_ELEMENTS = 1 << 32
_U32_MAX = (1 << 32) - 1

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.float64: 4,
}
for _code, _name in (
    (5, "float8_e4m3fn"),
    (6, "float8_e5m2"),
    (7, "float8_e4m3fnuz"),
    (8, "float8_e5m2fnuz"),
):
    if hasattr(torch, _name):
        DTYPE_CODES[getattr(torch, _name)] = _code
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}


@dataclass(frozen=True)
class Header:
    dtype: torch.dtype
    shape: tuple[int, ...]
    spec: str
    key: int | None
    payload_len: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Section:
    """One byte stream of a payload. ``width`` is the element size in bytes (for byte shuffling)."""

    data: np.ndarray  # 1-D uint8, C-contiguous
    width: int = 1
    compressed: bool = False
    raw_len: int = -1

    def __post_init__(self) -> None:
        if self.raw_len < 0:
            self.raw_len = int(self.data.nbytes)


def as_bytes_array(t: torch.Tensor | np.ndarray) -> np.ndarray:
    """A flat uint8 numpy view of a contiguous CPU tensor or array (no copy when possible)."""
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous().reshape(-1)
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        elif t.dtype not in (torch.uint8, torch.int8) and t.element_size() == 1:
            t = t.view(torch.uint8)
        arr = t.numpy()
    else:
        arr = np.ascontiguousarray(t).reshape(-1)
    return arr.view(np.uint8)


def checksum(version: int, data: bytes | bytearray | memoryview | np.ndarray, crc: int = 0) -> int:
    """The trailer's checksum function of a format version, continuing from ``crc``."""
    if version == 1:
        return crc32(data if not isinstance(data, np.ndarray) else data.data, crc)
    return crc32c(data, crc)


def prefix(
    header: Header, sections: Sequence[tuple[int, bool, int, int]], version: int | None = None
) -> bytes:
    """Every byte before the sections' data: fixed header, dims, spec and section table. ``sections``
    are (width, compressed, raw_len, stored_len) each, so a writer can lay out a payload before its
    sections exist (the one-pass encoder writes them in place)."""
    version = write_version() if version is None else version
    if version not in VERSIONS:
        raise EncodeError(f"cannot write payload format version {version}; known: {VERSIONS}")
    if len(header.shape) > MAX_NDIM:
        raise EncodeError(f"tensor has {len(header.shape)} dims; at most {MAX_NDIM} are supported")
    spec = header.spec.encode("ascii")
    table = [struct.pack("<B", len(sections))]
    for width, compressed, raw_len, stored in sections:
        if stored > _U32_MAX or raw_len > _U32_MAX:
            raise EncodeError("a payload section exceeds 4 GiB; split the tensor into parts (key part field)")
        table.append(_SECTION.pack(width, 1 if compressed else 0, raw_len, stored))
    payload_len = sum(len(b) for b in table) + sum(s[3] for s in sections)
    if payload_len > _U32_MAX:
        raise EncodeError("payload exceeds 4 GiB; split the tensor into parts (key part field)")
    fixed = _FIXED.pack(
        MAGIC,
        version,
        DTYPE_CODES[header.dtype],
        len(header.shape),
        1 if header.key is not None else 0,
        len(spec),
        0,
        payload_len,
        header.key or 0,
    )
    dims = struct.pack(f"<{len(header.shape)}Q", *header.shape)
    return b"".join([fixed, dims, spec, *table])


def seal(buf: bytearray) -> bytes:
    """Rewrite the trailer of an edited payload for the version its header names (v2's checksum when
    that version is unknown): for tools and tests that forge payloads the checksum would stop."""
    version = buf[4] if len(buf) > 4 and buf[4] in VERSIONS else VERSION
    buf[-CRC_SIZE:] = struct.pack("<I", checksum(version, bytes(buf[:-CRC_SIZE])))
    return bytes(buf)


def pack(header: Header, sections: Sequence[Section], version: int | None = None) -> bytes:
    """Serialize a header and its sections; appends the checksum trailer."""
    version = write_version() if version is None else version
    metas = [(s.width, s.compressed, s.raw_len, int(s.data.nbytes)) for s in sections]
    parts: list[bytes | memoryview] = [prefix(header, metas, version)]
    parts.extend(s.data.data for s in sections)
    crc = 0
    for p in parts:
        crc = checksum(version, p, crc)
    parts.append(struct.pack("<I", crc))
    return b"".join(parts)


def unpack_header(
    data: bytes | bytearray | memoryview, max_elements: int = MAX_ELEMENTS
) -> tuple[Header, int]:
    """Parse and validate the header; returns it and the payload offset. Checks the CRC first."""
    mv = memoryview(data).cast("B")
    if len(mv) < FIXED_SIZE + CRC_SIZE:
        raise DecodeError(
            f"payload of {len(mv)} bytes is shorter than the {FIXED_SIZE + CRC_SIZE}-byte minimum"
        )
    magic, version, dcode, ndim, flags, spec_len, _res, payload_len, key = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise DecodeError(f"bad magic {bytes(magic)!r}; not a potluck compression payload")
    if version not in VERSIONS:
        raise DecodeError(f"payload format version {version} is not supported (this build reads {VERSIONS})")
    expected = FIXED_SIZE + 8 * ndim + spec_len + payload_len + CRC_SIZE
    if len(mv) != expected:
        raise DecodeError(f"payload is {len(mv)} bytes but its header declares {expected} (truncated?)")
    (crc,) = struct.unpack_from("<I", mv, len(mv) - CRC_SIZE)
    if checksum(version, mv[: len(mv) - CRC_SIZE]) != crc:
        raise DecodeError("checksum mismatch: the payload is corrupted")
    if dcode not in CODE_DTYPES:
        raise DecodeError(f"unknown dtype code {dcode}")
    if ndim > MAX_NDIM or spec_len > MAX_SPEC_LEN:
        raise DecodeError(
            f"header declares {ndim} dims or a {spec_len}-byte spec; limits are {MAX_NDIM}/{MAX_SPEC_LEN}"
        )
    shape = struct.unpack_from(f"<{ndim}Q", mv, FIXED_SIZE)
    numel = 1
    for d in shape:
        numel *= d  # Python ints: no overflow; checked before any allocation
    if numel > max_elements:
        raise DecodeError(f"header declares {numel} elements (shape {shape}); the limit is {max_elements}")
    off = FIXED_SIZE + 8 * ndim
    try:
        spec = bytes(mv[off : off + spec_len]).decode("ascii")
    except UnicodeDecodeError as exc:
        raise DecodeError("spec is not ASCII") from exc
    header = Header(CODE_DTYPES[dcode], tuple(shape), spec, key if flags & 1 else None, payload_len)
    return header, off + spec_len


def unpack_sections(data: bytes | bytearray | memoryview, offset: int, payload_len: int) -> list[Section]:
    """Split the payload into sections (still possibly zstd-compressed); validates the table."""
    mv = memoryview(data).cast("B")
    end = offset + payload_len
    if payload_len < 1:
        raise DecodeError("empty payload: no section table")
    count = mv[offset]
    if count > MAX_SECTIONS:
        raise DecodeError(f"payload declares {count} sections; at most {MAX_SECTIONS}")
    pos = offset + 1
    if pos + count * _SECTION.size > end:
        raise DecodeError("section table runs past the payload")
    metas = []
    for _ in range(count):
        metas.append(_SECTION.unpack_from(mv, pos))
        pos += _SECTION.size
    out = []
    for width, flags, raw_len, stored in metas:
        if pos + stored > end:
            raise DecodeError("a section runs past the payload (truncated?)")
        if width not in (1, 2, 4, 8) or flags > 1 or (not flags & 1 and raw_len != stored):
            raise DecodeError(f"bad section entry width={width} flags={flags} raw={raw_len} stored={stored}")
        arr = np.frombuffer(mv[pos : pos + stored], dtype=np.uint8)
        out.append(Section(arr, width, bool(flags & 1), raw_len))
        pos += stored
    if pos != end:
        raise DecodeError(f"{end - pos} stray bytes after the last section")
    return out
