#!/usr/bin/env python3
"""The hivemind baseline of issue 15's headline benchmark: one ``hivemind.Optimizer`` peer per process.

Every peer trains potluck's own job (the demo job of ``potluck/testbed/demojob.py`` unless ``--job
FILE`` names another) in pure data parallel: the WHOLE model in this process, hivemind 1.1.12 averaging
gradients. The code is ``potluck/testbed/baseline/`` (its docstring says what is matched against potluck
and where it comes from; ``settings.py`` why each hivemind setting); ``worker.py`` there is this command.

Bytes on the wire, two counters per record (``p2pd_sent``/``p2pd_recv`` and ``ns_tx``/``ns_rx``): see
``potluck/testbed/baseline/wire.py``.

Output (``--out``, JSON lines): ``{"event": "start", ...}`` once the swarm is complete, then one
``{"event": "epoch", ...}`` per optimizer epoch (wall time, this peer's tokens, the swarm's nominal
tokens = epochs x job.batch.tokens_per_step, this peer's mean loss over the epoch, lr, bytes so far),
and ``{"event": "done", ...}`` with a parameter fingerprint. The swarm's exact tokens at epoch e are
the sum over peers of ``tokens_local`` at epoch e (``swarm_summary`` does that, and the swarm's
sample-weighted loss per epoch). The two differ: an epoch ends when a peer learns that the swarm has
``target_batch_size`` samples, at hivemind's next progress refresh (>= 0.5 s), and the demo's epochs are
~0.3 s of compute, so on loopback 4 peers computed ~3x the target per epoch. Potluck counts
steps x tokens_per_step, i.e. the nominal count; the computed count is the honest cost.

    # first peer: prints {"peer_index": 0, "maddrs": [...]} on stdout
    python scripts/wan_hivemind.py --host 10.0.0.1 --peer-index 0 --n-peers 4 --tokens 614400 \\
        --compression fp16 --out p0.jsonl --print-maddrs
    # the others
    python scripts/wan_hivemind.py --host 10.0.0.2 --initial-peers /ip4/10.0.0.1/tcp/41234/p2p/Qm... \\
        --peer-index 1 --n-peers 4 --tokens 614400 --compression fp16 --out p1.jsonl

Exit status: 0 done, 2 bad arguments, 3 the swarm did not assemble or a hard timeout, 1 other errors.
Children (the DHT and averager processes, the p2p daemon) die with the worker, however it dies.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from potluck.testbed.baseline.worker import end_process, main

if __name__ == "__main__":
    end_process(main(doc=__doc__))
