# The potluck coordinator: `potluck launch JOB` with its embedded MQTT broker and web dashboard.
# It plans and checks, it does not train, so it always gets CPU torch. Build from the repository root:
#
#   docker build -f docker/coordinator.Dockerfile \
#     --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index> -t potluck-coordinator:0.1.0 .
#
# (or TORCH_FIND_LINKS=<dir with the torch TORCH_VERSION+cpu wheel>, mounted into the build).
# The image carries examples/tiny.toml as /opt/potluck/jobs/tiny.toml; mount your own job file.

# Any Debian or Ubuntu image, with Python >= 3.11 or without (then it gets the distribution's python3).
ARG BASE=python:3.11-slim-bookworm

# ---- python: the base plus an interpreter, tini (PID 1) and CA certificates; both stages start here
FROM ${BASE} AS python
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
# $pkgs is a word list on purpose
# hadolint ignore=SC2086
RUN set -eu; \
    pkgs="tini ca-certificates"; \
    command -v python3 >/dev/null 2>&1 || pkgs="$pkgs python3 python3-venv"; \
    apt-get update; \
    apt-get install -y --no-install-recommends $pkgs; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version'

# ---- builder: a virtual environment with pinned CPU torch, then potluck and its pinned dependencies
FROM python AS builder
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
    if [ -n "$TORCH_FIND_LINKS" ]; then src="--find-links $TORCH_FIND_LINKS"; \
    elif [ -n "$TORCH_INDEX_URL" ]; then src="--index-url $TORCH_INDEX_URL"; \
    else echo "needs --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index>" \
              "(or TORCH_FIND_LINKS=<dir with the torch ${TORCH_VERSION}+cpu wheel>)" >&2; exit 2; fi; \
    /opt/potluck/bin/pip install $src "torch==${TORCH_VERSION}+cpu"
COPY pyproject.toml README.md /src/
COPY potluck /src/potluck
# torch/test holds C++ test binaries (83 MB) nothing imports
RUN /opt/potluck/bin/pip install /src \
    && rm -rf /src /opt/potluck/lib/python3*/site-packages/torch/test
COPY docker/entrypoint.sh /opt/potluck/bin/potluck-entrypoint
COPY docker/healthcheck.py /opt/potluck/bin/potluck-healthcheck
COPY examples/tiny.toml /opt/potluck/jobs/tiny.toml
RUN chmod 0755 /opt/potluck/bin/potluck-entrypoint /opt/potluck/bin/potluck-healthcheck \
    && sed -i '1s|.*|#!/opt/potluck/bin/python|' /opt/potluck/bin/potluck-healthcheck

# ---- runtime: the base, the venv, an unprivileged user; no compiler, no pip cache, no sources
FROM python AS runtime
RUN groupadd --gid 10001 potluck \
    && useradd --uid 10001 --gid 10001 --home-dir /home/potluck --create-home --shell /usr/sbin/nologin potluck \
    && mkdir -p /home/potluck/.potluck /shared \
    && chown -R potluck:potluck /home/potluck /shared \
    && chmod 0700 /home/potluck/.potluck
COPY --from=builder /opt/potluck /opt/potluck
ENV PATH=/opt/potluck/bin:$PATH \
    HOME=/home/potluck \
    PYTHONUNBUFFERED=1 \
    POTLUCK_CODEC_BACKEND=eager \
    POTLUCK_DASHBOARD_PORT=8470
USER 10001:10001
# A job's relative checkpoint.dir (tiny.toml: checkpoints/tiny) lands on the volume too.
WORKDIR /home/potluck/.potluck
# The coordinator's key (coordinator.pem), its memory of unfinished runs, and the job's checkpoints.
VOLUME ["/home/potluck/.potluck"]
# 31337: libp2p (peers dial it: publish it); 1883: the embedded MQTT broker; 8470: the dashboard
EXPOSE 31337/tcp 1883/tcp 8470/tcp
# Asks the coordinator itself: its dashboard server answers /healthz from the coordinator's event loop.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["/opt/potluck/bin/potluck-healthcheck", "coordinator"]
# SIGTERM (docker stop) stops the coordinator cleanly; the peers train on and a relaunch with the same
# volume (same key) carries on with the same swarm.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/potluck/bin/potluck-entrypoint"]
CMD ["launch", "/opt/potluck/jobs/tiny.toml", "--host-maddrs", "/ip4/0.0.0.0/tcp/31337"]
