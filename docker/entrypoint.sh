#!/bin/sh
# Container entrypoint (tini runs it as PID 1's child): `potluck ARGS`, exec'd, so SIGTERM from
# `docker stop` reaches potluck itself, which leaves the swarm gracefully.
#
# Two additions, both only when the caller did not say otherwise:
#   peer:   --metrics-port $POTLUCK_METRICS_PORT (9400; on 127.0.0.1): the HEALTHCHECK asks /metrics.
#   launch: --dashboard-bind 0.0.0.0:$POTLUCK_DASHBOARD_PORT (8470): the HEALTHCHECK asks /healthz, and
#           a published port reaches the dashboard.
# And one wait: with `--join @FILE` and POTLUCK_INVITE_WAIT=S, wait up to S seconds for FILE to appear
# (compose: the coordinator writes the invite to a volume the peers share).
set -eu

has_flag() {  # has_flag FLAG ARGS...: is FLAG (or FLAG=...) among ARGS?
  flag=$1; shift
  for a in "$@"; do
    case "$a" in "$flag" | "$flag"=*) return 0 ;; esac
  done
  return 1
}

invite_file() {  # the FILE of --join @FILE (or --join=@FILE), if any
  prev=
  for a in "$@"; do
    case "$a" in --join=@*) echo "${a#--join=@}"; return ;; esac
    if [ "$prev" = --join ]; then
      case "$a" in @*) echo "${a#@}"; return ;; esac
    fi
    prev=$a
  done
}

case "${1:-}" in
  peer)
    if ! has_flag --help "$@" && ! has_flag --metrics-port "$@"; then
      set -- "$@" --metrics-port "${POTLUCK_METRICS_PORT:-9400}"
    fi
    file=$(invite_file "$@")
    wait_s=${POTLUCK_INVITE_WAIT:-0}
    if [ -n "$file" ] && [ "$wait_s" -gt 0 ] && [ ! -s "$file" ]; then
      echo "waiting up to ${wait_s} s for the invite in $file" >&2
      while [ "$wait_s" -gt 0 ] && [ ! -s "$file" ]; do
        sleep 1
        wait_s=$((wait_s - 1))
      done
    fi
    ;;
  launch)
    if ! has_flag --help "$@" && ! has_flag --dashboard-bind "$@"; then
      set -- "$@" --dashboard-bind "0.0.0.0:${POTLUCK_DASHBOARD_PORT:-8470}"
    fi
    ;;
esac
exec potluck "$@"
