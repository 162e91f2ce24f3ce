#!/usr/bin/env bash
# The whole GPU check in one call, on a machine with an NVIDIA GPU, torch and Triton but no hivemind and
# no package index (docs/gpu.md): install the carried wheels, then
#   1. the CPU-testable GPU code's unit tests, now on the device (staging, autocast, device selection);
#   2. scripts/gpu_kernels_check.py: Triton codec kernels bit-identical to the CPU path, and their
#      bandwidth against a device-to-device copy (target >= 70%);
#   3. scripts/gpu_swarm_check.py: two peer processes sharing the GPU train the demo model and a
#      12-layer d-768 model as a 1 x 2 swarm; loss against the CPU's, tokens/s, GPU utilisation.
# Results go to $OUT (the device tool brings them back) or ./gpu-out: gpu_check.log, pytest.log,
# gpu_kernels.json, gpu_swarm.json, swarm_logs.tar.gz. Each phase has its own time limit, so the run
# ends inside the device tool's 10 minutes with whatever was measured.
#
#   here:   scripts/gpu_wheels.sh                         # once: wheels/ (about 26 MiB, git-ignored)
#   device: run(command="scripts/gpu_check.sh", carry=["wheels"], timeout_s=600)
#   here, no GPU: scripts/gpu_check.sh --cpu-dry-run     # the same phases, tiny, on the CPU
set -uo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in
  -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  '' | --cpu-dry-run) ;;
  *) echo "usage: scripts/gpu_check.sh [--cpu-dry-run]" >&2; exit 2 ;;
esac
DRY=()
[[ ${1:-} == --cpu-dry-run ]] && DRY=(--cpu-dry-run)
OUT=${OUT:-$PWD/gpu-out}
WHEELS=${WHEELS:-wheels}
SITE=${SITE:-/tmp/potluck-site}
PY=${PY:-python3}
[[ ${#DRY[@]} -gt 0 && -x .venv/bin/python && $PY == python3 ]] && PY=.venv/bin/python
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
status=0
phase() { echo; echo "=== $* ($(date +%T))"; }

phase "machine"
uname -m
"$PY" -V
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used \
    --format=csv || echo "no nvidia-smi"

phase "dependencies"
if "$PY" -c "import hivemind" 2>/dev/null; then
    echo "hivemind importable already"
elif compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl || { echo "wheel install failed"; exit 3; }
    export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    chmod +x "$SITE"/hivemind/hivemind_cli/p2pd 2>/dev/null || true
else
    echo "no hivemind and no $WHEELS/*.whl: run scripts/gpu_wheels.sh here and carry $WHEELS"
    exit 3
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'EOF' || { echo "imports failed"; exit 3; }
import hivemind, torch
import potluck.cli, potluck.peer.daemon  # noqa: F401
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton missing: CUDA tensors fall back to the eager torch codec path")
print("hivemind", hivemind.__version__)
EOF

phase "unit tests of the device code (on the device)"
timeout "${PYTEST_S:-120}" "$PY" -m pytest -q -p no:cacheprovider tests/unit/model/test_staging.py \
    tests/unit/model/test_device.py tests/unit/model/test_autocast.py \
    tests/unit/peer/train/test_pipeline_staging.py 2>&1 | tee "$OUT/pytest.log" | tail -15
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

phase "codec kernels: bytes and bandwidth"
timeout "${KERNELS_S:-150}" "$PY" scripts/gpu_kernels_check.py "${DRY[@]}" --out "$OUT/gpu_kernels.json" || status=1

phase "1 x 2 swarm on one GPU"
RUNS=$(mktemp -d /tmp/potluck-gpu-swarm-XXXX)
timeout "${SWARM_S:-330}" "$PY" scripts/gpu_swarm_check.py "${DRY[@]}" --run-dir "$RUNS" \
    --out "$OUT/gpu_swarm.json" ${SWARM_ARGS:-} || status=1
tar -czf "$OUT/swarm_logs.tar.gz" -C "$RUNS" --exclude='*.safetensors' --exclude='*.pem' --exclude='*.p2pkey' --exclude='*.key' --exclude=checkpoints . 2>/dev/null || true

phase "done: status $status"
ls -la "$OUT"
exit $status
