#!/usr/bin/env bash
# The README's test command: set up from nothing, lint, type-check, then run one tier of the suite
# (docs/development.md, Tests). Budgets are on 2 cores from a warm .venv.
#   scripts/test.sh                    everything; what README and .ci/run call (<= 25 min; or --full)
#   scripts/test.sh --commit           all but `extended` and `docker` tests, before a commit (<= 15 min)
#   scripts/test.sh --fast             unit tests with no tier marker: no swarm, no network (<= 3 min)
#   scripts/test.sh --fast -x          other arguments go to pytest
#   scripts/test.sh --fast tests/unit/sim -k dht   a path given replaces the tier's default paths
# It runs on one pytest worker per core, at most 4 (POTLUCK_TEST_WORKERS=N sets N; 1 runs in this
# process, as a caller's own -n or -p no:xdist also does): the process swarms one after another on one
# worker, the unit tests file by file on the others (tests/conftest.py groups them).
# It prints its time and the 25 slowest tests. The commit and full tiers fail when mosquitto or chromium
# is missing and cannot be installed: the tests that need them would otherwise only be skipped.
set -euo pipefail
start=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

tier=full
args=()
for a in "$@"; do
  case "$a" in
    --fast) tier=fast ;;
    --commit) tier=commit ;;
    --full) tier=full ;;
    *) args+=("$a") ;;
  esac
done

# A path among the arguments (a file, a folder, or file::test) replaces the tier's default paths.
has_path=0
for a in ${args[@]+"${args[@]}"}; do
  if [[ "$a" != -* && -e "${a%%::*}" ]]; then has_path=1; fi
done
case "$tier" in
  # The tier's -m comes first, so a -m of the caller's replaces it.
  fast) select=(-m "not slow and not integration and not extended and not docker"); paths=(tests/unit) ;;
  commit) select=(-m "not extended and not docker"); paths=() ;;
  full) select=(); paths=() ;;
esac
if [ "$has_path" = 1 ]; then paths=(); fi

# Workers: the cores, at most 4 (the swarms take one worker whatever the count; the unit tests, ~6 min
# of CPU, spread over the rest). The caller's -n, --numprocesses or -p no:xdist wins.
workers="${POTLUCK_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}"
if [ -z "${POTLUCK_TEST_WORKERS:-}" ] && [ "$workers" -gt 4 ]; then workers=4; fi
for a in ${args[@]+"${args[@]}"}; do
  case "$a" in -n|-n[0-9]*|--numprocesses*|no:xdist) workers=1 ;; esac
done
parallel=()
if [ "$workers" -gt 1 ]; then parallel=(-n "$workers"); fi  # tests/conftest.py brings the scheduler

elapsed() { echo $(( $(date +%s) - $1 )); }
report() {
  local rc=$?
  echo "==> $tier tier: $(elapsed "$start") s in all (exit $rc)"
}
trap report EXIT

# System packages the commit and full tiers use (a real MQTT broker, a real browser), as the tests
# find them (tests/helpers/mqtt.py, tests/helpers/browser.py).
have_mosquitto() { command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || [ -x /usr/bin/mosquitto ]; }
have_chromium() {
  command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || [ -x /usr/bin/chromium-browser ] \
    || [ -x /usr/bin/google-chrome ]
}
missing() {
  local m=()
  have_mosquitto || m+=(mosquitto)
  have_chromium || m+=(chromium)
  echo "${m[*]}"
}
if [ "$tier" != fast ]; then
  need="$(missing)"
  if [ -n "$need" ]; then
    sudo=()
    [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && sudo=(sudo -n); }
    if { [ "$(id -u)" = 0 ] || [ ${#sudo[@]} -gt 0 ]; } && command -v apt-get >/dev/null 2>&1; then
      echo "==> apt-get install $need"
      # shellcheck disable=SC2086  # $need is a list of package names
      ${sudo[@]+"${sudo[@]}"} apt-get update -qq >/dev/null || true
      DEBIAN_FRONTEND=noninteractive ${sudo[@]+"${sudo[@]}"} apt-get install -y -qq --no-install-recommends \
        $need >/dev/null || true
    fi
    need="$(missing)"
  fi
  if [ -n "$need" ]; then
    cat >&2 <<EOF

================================================================================
error: the $tier tier needs these system packages, and they are missing: $need
  Installing them needs root (or password-less sudo) and apt-get; that failed or was not possible.
  Without them the telemetry and dashboard tests would be skipped, so the suite does not run at all.
  Install them (Debian/Ubuntu: apt-get install mosquitto chromium), or run
  scripts/test.sh --fast, which needs neither.
================================================================================
EOF
    exit 3
  fi
fi

source "$ROOT/scripts/_setup.sh" dev

t=$(date +%s)
echo "==> ruff";  ruff check potluck tests scripts && ruff format --check potluck tests scripts
echo "==> mypy";  mypy
echo "==> lint and types took $(elapsed "$t") s"

echo "==> pytest ($tier tier, $workers worker(s))"
t=$(date +%s)
rc=0
pytest -q -p no:cacheprovider --durations=25 ${parallel[@]+"${parallel[@]}"} ${select[@]+"${select[@]}"} ${paths[@]+"${paths[@]}"} \
  ${args[@]+"${args[@]}"} || rc=$?
echo "==> pytest took $(elapsed "$t") s"
if [ "$rc" = 5 ]; then
  echo "error: pytest ran no tests (exit 5): the $tier tier with these arguments selects nothing" >&2
fi
exit "$rc"
