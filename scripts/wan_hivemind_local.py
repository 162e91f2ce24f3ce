#!/usr/bin/env python3
"""Loopback smoke run of the hivemind baseline: N ``scripts/wan_hivemind.py`` workers on 127.0.0.1.

Starts peer 0, reads its multiaddrs, starts the others bootstrapped to it, waits for every worker (each
one a process group of its own, killed by PID on exit, Ctrl-C or failure, and dying with this process
anyway: PR_SET_PDEATHSIG), then prints one JSON line: ``swarm_summary`` of the workers' records (swarm
tokens/s, loss per epoch, bytes of the p2p daemons) plus the run's settings. The code is
``potluck/testbed/baseline/local.py`` (the integration test runs it too).

    python scripts/wan_hivemind_local.py --peers 3 --epochs 300 --compression fp16

Worker logs and records stay in ``--run-dir`` (a temporary directory by default, printed on stderr).

Measured on the 2-core box (demo job, fp16, defaults: matchmaking 2 s, parameters averaged every epoch,
one torch thread per worker, other work on the machine too):

- 3 peers, 100 epochs: 263 s of training (2.6 s an epoch: matchmaking sets the pace, compute is ~0.1 s
  per peer), loss 5.56 -> 0.63 (potluck's single-process reference, same job, 100 steps: 0.66);
  gradients averaged by all 3 peers on 98% of peer-epochs, 2 resyncs; 15.9 MB sent per epoch by the
  swarm (5.3 MB a peer: fp16 gradients and parameters, 1.84 MB each).
- 4 peers, 300 epochs: 878 s (2.9 s an epoch), loss 5.57 -> 0.58 (reference 0.61); 98% full groups, 5
  resyncs; 24 MB per epoch (6 MB a peer). 700 tokens/s counted as potluck counts (epochs x 2,048), but
  the peers computed 98 sequences an epoch for a target of 32 (hivemind learns that an epoch is full
  only at its next progress refresh, >= 0.5 s, and these epochs need ~0.3 s of compute): 2,135
  computed tokens/s, and loss 0.645 after 614 k computed tokens.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from potluck.testbed.baseline.local import parse_args, run

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        summary = run(args)
    except KeyboardInterrupt:
        logger.error("interrupted; workers stopped")
        return 130
    except RuntimeError as e:
        logger.error("%s", e)
        return 1
    if not args.curve:
        summary.pop("curve", None)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
