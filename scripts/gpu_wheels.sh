#!/usr/bin/env bash
# Fetch, HERE (where pip reaches the package index), the wheels that the GPU machine lacks, into an
# ignored folder that the device tool carries: hivemind==1.1.12 (with its p2pd binary) and the rest of
# potluck's runtime dependencies that the GPU image does not ship. scripts/gpu_check.sh installs them
# there with --no-index. Versions are the ones this checkout's .venv runs its tests with.
#
#   scripts/gpu_wheels.sh              # -> wheels/ (about 25 MiB; ignored via .git/info/exclude)
#   WHEELS=somewhere scripts/gpu_wheels.sh
#
# The GPU machine (docs/gpu.md): x86-64, CPython 3.12, torch + Triton + numpy + scipy + aiohttp + ...
# already installed. What it has is listed in PRESENT below (from the device tool's package list);
# everything else potluck imports at run time is fetched. grpcio-tools (hivemind builds its protobuf
# modules with it, never imports it) is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-wheels}
PY=${PY:-.venv/bin/python}
PYVER=${GPU_PYTHON_VERSION:-3.12}
[[ -x $PY ]] || { echo "no $PY: run scripts/test.sh (or make .venv) first" >&2; exit 2; }

# keep the folder out of git (and so out of the working tree the device tool sends, except when carried)
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$WHEELS/" "$exclude" 2>/dev/null || echo "/$WHEELS/" >>"$exclude"
mkdir -p "$WHEELS"

# name==version for every distribution potluck needs at run time, transitively, minus what is there
mapfile -t WANT < <("$PY" - <<'EOF'
import re
from importlib import metadata

PRESENT = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click cloudpickle colorama filelock frozenlist fsspec grpcio h11 httpcore httpx
idna jinja2 markdown-it-py markupsafe mdurl mpmath msgpack multidict networkx numpy packaging pillow
pip prometheus-client propcache protobuf psutil pygments pyyaml requests rich safetensors scipy
setuptools shellingham six sortedcontainers sympy torch triton typer typing-extensions
typing-inspect urllib3 uvloop wheel yarl xxhash
""".split()
SKIP = {"grpcio-tools", "potluck"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


present = {norm(n) for n in PRESENT}
seen: dict[str, str] = {}
todo = ["potluck"]
while todo:
    dist = metadata.distribution(todo.pop())
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        name = norm(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
        if name in seen or name in SKIP:
            continue
        try:
            seen[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # a platform-conditional requirement this machine does not need either
        todo.append(name)
for name in sorted(seen):
    if name not in present:
        print(f"{name}=={seen[name]}")
EOF
)
echo "fetching ${#WANT[@]} wheels for CPython $PYVER x86-64 into $WHEELS/: ${WANT[*]}"
PLATFORMS=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${p}_x86_64")
done
for spec in "${WANT[@]}"; do
    name=${spec%%==*}
    if ls "$WHEELS" | grep -qi "^${name//-/[-_]}-${spec##*==}-"; then
        continue  # already there
    fi
    if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
        --implementation cp "${PLATFORMS[@]}" -d "$WHEELS" "$spec" 2>/dev/null; then
        # no binary wheel published (a pure-Python sdist): build one here; it runs anywhere
        "$PY" -m pip wheel -q --no-deps -w "$WHEELS" "$spec"
    fi
done
for whl in "$WHEELS"/*.whl; do  # a wheel built for this machine's CPython only would not load there
    case $whl in
    *-none-any.whl | *-abi3-* | *-cp${PYVER/./}-* | *py3-none-manylinux*) ;;
    *) echo "warning: $whl may not install on CPython $PYVER" >&2 ;;
    esac
done
du -sh "$WHEELS"
echo "carry it: run(command='scripts/gpu_check.sh', carry=['$WHEELS'])"
