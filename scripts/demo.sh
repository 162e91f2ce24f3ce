#!/usr/bin/env bash
# The README's demo command: set up from nothing, then run a local swarm on embedded defaults.
#   scripts/demo.sh [potluck demo options]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/_setup.sh" ""
exec potluck demo "$@"
