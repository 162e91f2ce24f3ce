"""``python -m potluck.compression.kernels [--portable] [--out PATH]``: build the native codec kernels
ahead of time (for an image without a compiler: point ``POTLUCK_KERNEL_LIB`` at the file) and print
the library's path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from potluck.compression.kernels import native


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--portable", action="store_true", help="for the architecture's baseline CPU, not this one"
    )
    ap.add_argument("--out", type=Path, help="where to write it (default: the kernel cache)")
    args = ap.parse_args()
    path = native.build(force=True, portable=args.portable, out=args.out)
    if path is None or native.load(path) is None:
        raise SystemExit("native codec kernels could not be built: is a C compiler installed (cc, or $CC)?")
    sys.stdout.write(f"{path}\n")


if __name__ == "__main__":
    main()
