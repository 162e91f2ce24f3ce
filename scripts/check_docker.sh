#!/usr/bin/env bash
# Build the CPU images with podman and train examples/tiny.toml with the compose swarm (a coordinator
# and 2 peers), then tear everything down; exit 0 only if the job reached its last step.
#
#   scripts/check_docker.sh                 (root; apt-installs podman, buildah, debootstrap, runc, podman-compose)
#
# No image registry is needed: the base image is a minimal Debian made by debootstrap and imported as
# localhost/debian-base:bookworm (kept, so later runs skip it); Python packages come from the package
# index inside the build. Environment:
#   POTLUCK_DOCKER_TIMEOUT   seconds the job may take once the swarm is up (default 1500)
#   TORCH_INDEX_URL          PyTorch's CPU wheel index, for torch==2.13.0+cpu
#   TORCH_WHEEL_DIR          or a directory holding that wheel (default: found in $PIP_FIND_LINKS)
#   POTLUCK_DOCKER_KEEP=1    leave the images (the swarm's containers and volumes always go)
#
# What this sandbox needed (docs/docker.md, "Verified here"): runc instead of crun (crun refuses the
# host's hybrid cgroup mounts), rlimits no higher than the host's (no CAP_SYS_RESOURCE), both set in a
# private containers.conf; the build mounts the host's CA bundle for pip (TLS goes through a proxy).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE_IMAGE=localhost/debian-base:bookworm
PEER_IMAGE=localhost/potluck-peer:0.1.0-cpu
COORD_IMAGE=localhost/potluck-coordinator:0.1.0
PROJECT=potluck-check
TIMEOUT=${POTLUCK_DOCKER_TIMEOUT:-1500}
WORK=$(mktemp -d /tmp/potluck-docker-check.XXXXXX)
start=$(date +%s)
log() { echo "==> [$(($(date +%s) - start)) s] $*"; }

# --- tools ------------------------------------------------------------------------------------------
need=()
for tool in podman buildah debootstrap runc podman-compose; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "need ${need[*]} (apt-get install them as root)" >&2; exit 2; }
  log "apt-get install ${need[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# A private containers.conf: runc, and rlimits the host lets a container set (at most its hard limits;
# here NPROC above 32768 was refused too, so the first value that starts a container wins; see below).
write_conf() {  # write_conf NOFILE NPROC
  cat > "$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$1:$1", "nproc=$2:$2"]
[engine]
runtime = "runc"
EOF
}
nofile=$(ulimit -Hn); nproc_max=$(ulimit -Hu)
[ "$nofile" = unlimited ] && nofile=1048576
[ "$nproc_max" = unlimited ] && nproc_max=4194304
write_conf "$nofile" "$nproc_max"
export CONTAINERS_CONF="$WORK/containers.conf"

compose() { podman-compose -p "$PROJECT" -f docker/compose.yaml "$@"; }
cleanup() {
  rc=$?
  set +e
  if [ $rc -ne 0 ] && [ -n "${swarm_up:-}" ]; then
    for c in $(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'); do
      echo "--- last lines of $c"
      podman logs --tail 25 "$c" 2>&1
    done
  fi
  if [ -n "${swarm_up:-}" ]; then
    log "tearing the swarm down"
    compose down -v -t 20 >/dev/null 2>&1
    # anything compose left behind (a half-started run)
    podman ps -aq --filter "label=io.podman.compose.project=$PROJECT" | xargs -r podman rm -f -t 5 >/dev/null 2>&1
    podman volume ls -q --filter "label=io.podman.compose.project=$PROJECT" | xargs -r podman volume rm -f >/dev/null 2>&1
    podman network ls -q --filter "label=io.podman.compose.project=$PROJECT" | xargs -r podman network rm -f >/dev/null 2>&1
  fi
  if [ -z "${POTLUCK_DOCKER_KEEP:-}" ] && [ -n "${built:-}" ]; then
    podman rmi -f "$PEER_IMAGE" "$COORD_IMAGE" >/dev/null 2>&1
    podman image prune -f >/dev/null 2>&1
  fi
  rm -rf "$WORK"
  log "done (exit $rc)"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- base image: a minimal Debian, made here --------------------------------------------------------
if podman image exists "$BASE_IMAGE"; then
  log "base image $BASE_IMAGE: cached"
else
  log "debootstrap --variant=minbase bookworm (once; the image is kept)"
  # the release's default mirror unless DEBIAN_MIRROR names another
  debootstrap --variant=minbase bookworm "$WORK/rootfs" ${DEBIAN_MIRROR:-} >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log"; exit 1; }
  tar -C "$WORK/rootfs" -c . | podman import - "$BASE_IMAGE" >/dev/null
  rm -rf "$WORK/rootfs"
fi

for nproc in "$nproc_max" 65536 32768 16384 8192 4096; do
  [ "$nproc" -le "$nproc_max" ] || continue
  write_conf "$nofile" "$nproc"
  if podman run --rm "$BASE_IMAGE" true >/dev/null 2>&1; then break; fi
  nproc=""
done
[ -n "$nproc" ] || { podman run --rm "$BASE_IMAGE" true; echo "podman cannot start a container" >&2; exit 1; }
log "podman runs containers (runc, nofile=$nofile, nproc=$nproc)"

# --- a CPU torch source -----------------------------------------------------------------------------
build_args=(--format docker --build-arg "BASE=$BASE_IMAGE")  # docker format: OCI images drop HEALTHCHECK
if [ -z "${TORCH_INDEX_URL:-}" ] && [ -z "${TORCH_WHEEL_DIR:-}" ]; then
  for dir in ${PIP_FIND_LINKS:-}; do
    if compgen -G "$dir/torch-2.13.0+cpu-*.whl" >/dev/null; then TORCH_WHEEL_DIR=$dir; break; fi
  done
fi
if [ -n "${TORCH_WHEEL_DIR:-}" ]; then
  build_args+=(--volume "$TORCH_WHEEL_DIR:/run/torch-wheels:ro" --build-arg TORCH_FIND_LINKS=/run/torch-wheels)
elif [ -n "${TORCH_INDEX_URL:-}" ]; then
  build_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
else
  echo "need a CPU torch: set TORCH_INDEX_URL or TORCH_WHEEL_DIR (see docs/docker.md)" >&2
  exit 2
fi
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [ -f "$ca" ]; then
  build_args+=(--volume "$ca:/run/host-ca.crt:ro" --build-arg PIP_CA_BUNDLE=/run/host-ca.crt)
fi

# --- build ------------------------------------------------------------------------------------------
built=1
for image in peer coordinator; do
  tag=$PEER_IMAGE; [ $image = coordinator ] && tag=$COORD_IMAGE
  log "building $tag"
  t0=$(date +%s)
  nice podman build "${build_args[@]}" -f "docker/$image.Dockerfile" \
    --ignorefile "docker/$image.Dockerfile.dockerignore" -t "$tag" . >"$WORK/build-$image.log" 2>&1 \
    || { tail -30 "$WORK/build-$image.log"; exit 1; }
  log "built $tag in $(($(date +%s) - t0)) s: $(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
done

# --- the swarm --------------------------------------------------------------------------------------
export POTLUCK_PEER_IMAGE=$PEER_IMAGE POTLUCK_COORDINATOR_IMAGE=$COORD_IMAGE
# the dashboard on a free port of this host (8470 may be taken by a demo or a test)
POTLUCK_DASHBOARD_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export POTLUCK_DASHBOARD_PORT
log "compose up: coordinator + 2 peers"
swarm_up=1
compose up -d >"$WORK/compose-up.log" 2>&1 || { cat "$WORK/compose-up.log"; exit 1; }
coord=$(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" \
  --filter "label=com.docker.compose.service=coordinator" --format '{{.Names}}' | head -1)
[ -n "$coord" ] || { echo "no coordinator container" >&2; exit 1; }

# Ask each container's HEALTHCHECK once the swarm is up (podman runs them on demand without systemd).
healthy=""
deadline=$(($(date +%s) + TIMEOUT))
while :; do
  state=$(podman inspect --format '{{.State.Status}}' "$coord")
  [ "$state" = exited ] && break
  [ "$state" = running ] || { echo "the coordinator is $state, not running" >&2; exit 1; }
  if [ -z "$healthy" ]; then
    ok=1
    for c in $(podman ps --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'); do
      podman healthcheck run "$c" >/dev/null 2>&1 || ok=""
    done
    if [ -n "$ok" ]; then
      healthy=1
      curl_ok=$(python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$POTLUCK_DASHBOARD_PORT/api/v1/state', timeout=5).status)" 2>&1 || true)
      log "dashboard published on 127.0.0.1:$POTLUCK_DASHBOARD_PORT (/api/v1/state: $curl_ok)"
      [ "$curl_ok" = 200 ] || { echo "the published dashboard did not answer" >&2; exit 1; }
      log "every container's HEALTHCHECK passes: $(podman ps --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}' | tr '\n' ' ')"
    fi
  fi
  if [ "$(date +%s)" -gt "$deadline" ]; then
    echo "the job did not finish within $TIMEOUT s" >&2
    exit 1
  fi
  sleep 10
done
code=$(podman inspect --format '{{.State.ExitCode}}' "$coord")
podman logs "$coord" >"$WORK/coordinator.log" 2>&1
if [ "$code" != 0 ] || ! grep -q "job tiny done" "$WORK/coordinator.log"; then
  echo "coordinator exited $code without finishing the job" >&2
  exit 1
fi
grep "job tiny done" "$WORK/coordinator.log"
[ -n "$healthy" ] || { echo "the HEALTHCHECKs never all passed while the swarm ran" >&2; exit 1; }

# A peer leaves on SIGTERM (graceful) well within its grace period.
for c in $(podman ps --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'); do
  t0=$(date +%s)
  podman stop -t 75 "$c" >/dev/null
  log "$c stopped by SIGTERM in $(($(date +%s) - t0)) s, exit $(podman inspect --format '{{.State.ExitCode}}' "$c")"
done
log "OK: the compose swarm trained tiny to its last step"
