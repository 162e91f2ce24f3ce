"""State serving at a lower priority than training: a share of this peer's uplink, not a pause.

A peer that trains also serves its state: to a newcomer taking a place in the next plan, to the peer
keeping a copy of its checkpoints, to the job owner's copy. Unpaced, one fetch fills a home uplink
(5-20 Mbit/s) for seconds, and the activations and gradient shards the pipeline waits on queue behind it
in the link's buffer: every step of the swarm slows while one peer is fed. So while this peer trains,
what it serves goes out at most at ``TransferConfig.serve_share`` of its uplink (half by default), summed
over every stream it serves; training traffic keeps the rest. When it does not train (between plans,
waiting for the state of a new one) serving runs at the link's full speed: then the fetch is what
everyone waits on.

The pacer (``net/pace.py``) is a virtual clock shared by the server's streams: each slice of bytes
reserves the next ``nbytes / rate`` seconds of the share and waits for its turn. Slices are small
(16 KiB) so a 1 MiB chunk does not leave as one burst that the uplink's queue would hold in front of a
training message. Idle time earns no credit: a fetch that starts after a quiet minute still starts at
the rate. The server sets the
rate (``StateServer._rate``), with a floor that keeps each chunk inside the fetcher's frame timeout.
A fetch with a cap of its own (``TransferConfig.rate_bytes_s``, background copies) waits on the same
throttle after each chunk it receives (``pull.py``).
"""

from __future__ import annotations

SERVE_SHARE = 0.5  # the default share of the uplink serving takes while the peer trains
