# The potluck peer: a volunteer's machine joins a swarm with one `docker run`.
# Build from the repository root (docs/docker.md has the details):
#
#   GPU host:  docker build -f docker/peer.Dockerfile --build-arg VARIANT=cuda \
#                --build-arg BASE=nvidia/cuda:13.0.1-runtime-ubuntu24.04 -t potluck-peer:0.1.0-cuda .
#   CPU host:  docker build -f docker/peer.Dockerfile --build-arg VARIANT=cpu \
#                --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index> -t potluck-peer:0.1.0-cpu .
#
# VARIANT=cpu installs torch==TORCH_VERSION+cpu (about 0.7 GB; from TORCH_INDEX_URL, or from a
# directory of wheels TORCH_FIND_LINKS mounted into the build); VARIANT=cuda installs the plain
# torch==TORCH_VERSION from the default index, which brings its own CUDA libraries as wheels (the host
# supplies only the driver, through the NVIDIA container toolkit).

# Any Debian or Ubuntu image: with Python >= 3.11 (python:3.11-slim-bookworm) or without (nvidia/cuda,
# a minimal Debian), which then gets the distribution's python3. Pin a digest in production.
ARG BASE=python:3.11-slim-bookworm

# ---- python: the base plus an interpreter, tini (PID 1) and CA certificates; both stages start here
FROM ${BASE} AS python
ARG VARIANT=cpu
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
# Triton (GPU codec kernels) compiles a small launcher with the C compiler at run time: cuda gets gcc.
# $pkgs is a word list on purpose
# hadolint ignore=SC2086
RUN set -eu; \
    pkgs="tini ca-certificates"; \
    command -v python3 >/dev/null 2>&1 || pkgs="$pkgs python3 python3-venv"; \
    if [ "$VARIANT" = cuda ]; then pkgs="$pkgs gcc libc6-dev"; fi; \
    apt-get update; \
    apt-get install -y --no-install-recommends $pkgs; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version'

# ---- builder: a virtual environment with pinned torch, then potluck and its pinned dependencies
FROM python AS builder
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
ARG TORCH_FIND_LINKS=
# PIP_CA_BUNDLE: a CA file mounted into the build, for a network whose TLS is re-signed by a proxy
# (the check script mounts the host's bundle); it goes into this stage's pip.conf only.
ARG PIP_CA_BUNDLE=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/potluck \
    && if [ -n "$PIP_CA_BUNDLE" ]; then printf '[global]\ncert = %s\n' "$PIP_CA_BUNDLE" > /etc/pip.conf; fi
# torch first and exactly pinned (as scripts/_setup.sh does): a floating torch pulls GBs of CUDA wheels.
# $src is a word list on purpose
# hadolint ignore=SC2086
RUN set -eu; \
    case "$VARIANT" in \
      cpu) spec="torch==${TORCH_VERSION}+cpu"; \
           if [ -n "$TORCH_FIND_LINKS" ]; then src="--find-links $TORCH_FIND_LINKS"; \
           elif [ -n "$TORCH_INDEX_URL" ]; then src="--index-url $TORCH_INDEX_URL"; \
           else echo "VARIANT=cpu needs --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index>" \
                     "(or TORCH_FIND_LINKS=<dir with the torch ${TORCH_VERSION}+cpu wheel>)" >&2; exit 2; fi ;; \
      cuda) spec="torch==${TORCH_VERSION}"; src="${TORCH_INDEX_URL:+--index-url $TORCH_INDEX_URL}" ;; \
      *) echo "VARIANT must be cpu or cuda, not '$VARIANT'" >&2; exit 2 ;; \
    esac; \
    /opt/potluck/bin/pip install $src "$spec"
COPY pyproject.toml README.md /src/
COPY potluck /src/potluck
# torch/test holds C++ test binaries (83 MB) nothing imports
RUN /opt/potluck/bin/pip install /src \
    && rm -rf /src /opt/potluck/lib/python3*/site-packages/torch/test
# The native CPU codec kernels, built here for the architecture's baseline CPU (the runtime image has no
# compiler; the same bits as a -march=native build, a little slower)
# hadolint ignore=DL3008
RUN set -eu; \
    if ! command -v cc >/dev/null; then \
      apt-get update; apt-get install -y --no-install-recommends gcc libc6-dev; rm -rf /var/lib/apt/lists/*; \
    fi; \
    /opt/potluck/bin/python -m potluck.compression.kernels --portable --out /opt/potluck/lib/plk_codec.so
COPY docker/entrypoint.sh /opt/potluck/bin/potluck-entrypoint
COPY docker/healthcheck.py /opt/potluck/bin/potluck-healthcheck
RUN chmod 0755 /opt/potluck/bin/potluck-entrypoint /opt/potluck/bin/potluck-healthcheck \
    && sed -i '1s|.*|#!/opt/potluck/bin/python|' /opt/potluck/bin/potluck-healthcheck

# ---- runtime: the base, the venv, an unprivileged user; no compiler, no pip cache, no sources
FROM python AS runtime
ARG VARIANT=cpu
RUN groupadd --gid 10001 potluck \
    && useradd --uid 10001 --gid 10001 --home-dir /home/potluck --create-home --shell /usr/sbin/nologin potluck \
    && mkdir -p /home/potluck/.potluck /shared \
    && chown -R potluck:potluck /home/potluck /shared \
    && chmod 0700 /home/potluck/.potluck
COPY --from=builder /opt/potluck /opt/potluck
# The codec kernels built in the builder stage; native: never try torch.compile (no compiler here).
ENV PATH=/opt/potluck/bin:$PATH \
    HOME=/home/potluck \
    PYTHONUNBUFFERED=1 \
    POTLUCK_IMAGE_VARIANT=${VARIANT} \
    POTLUCK_KERNEL_LIB=/opt/potluck/lib/plk_codec.so \
    POTLUCK_CODEC_BACKEND=native \
    POTLUCK_METRICS_PORT=9400
USER 10001:10001
WORKDIR /home/potluck
# The peer's key (identity.pem, 0600) and checkpoints: keep this volume and the peer keeps its identity.
VOLUME ["/home/potluck/.potluck"]
# 31337: libp2p (optional: a peer needs no open port, see docs/docker.md); 9400: /metrics, loopback only
EXPOSE 31337/tcp
# Asks the peer itself: its Prometheus /metrics must answer with the peer's own gauges.
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["/opt/potluck/bin/potluck-healthcheck", "peer"]
# SIGTERM (docker stop) is a graceful leave: a training peer hands its work over first (<= 60 s), so
# give it time: docker stop -t 75 / compose stop_grace_period: 75s.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/potluck/bin/potluck-entrypoint"]
CMD ["peer", "--help"]
