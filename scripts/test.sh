#!/usr/bin/env bash
# The README's test command: set up from nothing, then lint, type-check and run the whole suite.
#   scripts/test.sh                 everything
#   scripts/test.sh tests/unit -x   extra arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# System packages the tests use (a real MQTT broker, a real browser), when we may install them.
need_apt=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> apt-get install ${need_apt[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "warning: not root; tests needing ${need_apt[*]} will be skipped" >&2
  fi
fi

source "$ROOT/scripts/_setup.sh" dev

start=$(date +%s)
echo "==> ruff";  ruff check potluck tests scripts && ruff format --check potluck tests scripts
echo "==> mypy";  mypy
echo "==> pytest"
pytest -q -p no:cacheprovider --durations=25 "$@"
echo "==> suite took $(( $(date +%s) - start )) s"
