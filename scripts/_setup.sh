# Sourced by scripts/test.sh and scripts/demo.sh: make .venv with potluck installed.
# Idempotent: a stamp keyed on pyproject.toml skips pip when nothing changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${POTLUCK_VENV:-$ROOT/.venv}"
EXTRAS="${1:-}"
PY="${PYTHON:-python3}"

if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "potluck needs Python >= 3.11 (found: $("$PY" --version 2>&1)); set PYTHON=python3.11" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.potluck-installed"
want="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)-$EXTRAS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing potluck${EXTRAS:+[$EXTRAS]} into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip wheel setuptools
  # torch first and exactly pinned: a floating torch would pull GBs of CUDA packages.
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
# Build the native codec kernels now (~5 s once per machine and source): not inside the first peer, nor in
# several test processes at once. Without a C compiler potluck runs the slower torch path instead. A
# stamp (the sources' and compiler's hash, the library's path) skips the build, and the ~5 s torch
# import it needs, while that library is still there.
kstamp="$VENV/.potluck-kernels"
kwant="$(cat "$ROOT/potluck/compression/kernels/native_codec.c" "$ROOT/potluck/compression/kernels/native.py" \
  | sha256sum | cut -c1-16)-${CC:-cc}-${POTLUCK_KERNEL_CACHE:-}"
khave="" klib=""
[ -f "$kstamp" ] && read -r khave klib < "$kstamp" || true
if [ "$khave" != "$kwant" ] || [ -z "$klib" ] || [ ! -f "$klib" ]; then
  if klib="$("$VENV/bin/python" -m potluck.compression.kernels)"; then
    echo "$kwant $klib" > "$kstamp"
  else
    echo "==> no native codec kernels (is a C compiler installed?); using the torch path" >&2
  fi
fi
