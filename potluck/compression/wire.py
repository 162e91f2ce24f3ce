"""The self-describing payload format (see docs/wire-format.md). All integers are little-endian.

A payload is ``header | spec | payload | crc32``:

    offset size  field
    0      4     magic b"PLKC"
    4      1     format version (1)
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
    ..     4     CRC32 (zlib) of every byte before it

The payload is ``u8 count`` then, per section, ``u8 width, u8 flags, u32 raw_len, u32 stored_len``,
then the sections' stored bytes in order. ``width`` is the element size used for byte shuffling;
flags bit0 = zstd-compressed (stored bytes are the zstd frame of the byte-shuffled raw bytes).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .errors import DecodeError, EncodeError

MAGIC = b"PLKC"
VERSION = 1
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


def pack(header: Header, sections: Sequence[Section]) -> bytes:
    """Serialize a header and its sections; appends the CRC32 trailer."""
    if len(header.shape) > MAX_NDIM:
        raise EncodeError(f"tensor has {len(header.shape)} dims; at most {MAX_NDIM} are supported")
    spec = header.spec.encode("ascii")
    table = [struct.pack("<B", len(sections))]
    for s in sections:
        stored = int(s.data.nbytes)
        if stored > _U32_MAX or s.raw_len > _U32_MAX:
            raise EncodeError("a payload section exceeds 4 GiB; split the tensor into parts (key part field)")
        table.append(_SECTION.pack(s.width, 1 if s.compressed else 0, s.raw_len, stored))
    payload_len = sum(len(b) for b in table) + sum(int(s.data.nbytes) for s in sections)
    if payload_len > _U32_MAX:
        raise EncodeError("payload exceeds 4 GiB; split the tensor into parts (key part field)")
    fixed = _FIXED.pack(
        MAGIC,
        VERSION,
        DTYPE_CODES[header.dtype],
        len(header.shape),
        1 if header.key is not None else 0,
        len(spec),
        0,
        payload_len,
        header.key or 0,
    )
    dims = struct.pack(f"<{len(header.shape)}Q", *header.shape)
    parts: list[bytes | memoryview] = [fixed, dims, spec, *table]
    parts.extend(s.data.data for s in sections)
    crc = 0
    for p in parts:
        crc = zlib.crc32(p, crc)
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
    if version != VERSION:
        raise DecodeError(f"payload format version {version} is not supported (this build reads {VERSION})")
    expected = FIXED_SIZE + 8 * ndim + spec_len + payload_len + CRC_SIZE
    if len(mv) != expected:
        raise DecodeError(f"payload is {len(mv)} bytes but its header declares {expected} (truncated?)")
    (crc,) = struct.unpack_from("<I", mv, len(mv) - CRC_SIZE)
    if zlib.crc32(mv[: len(mv) - CRC_SIZE]) != crc:
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
