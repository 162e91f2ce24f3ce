#!/usr/bin/env python3
"""The images' HEALTHCHECK: ask the potluck process itself, over HTTP on loopback, not just "is it running".

  potluck-healthcheck peer          GET /metrics on 127.0.0.1:$POTLUCK_METRICS_PORT (9400): the peer's own
                                    Prometheus text, which must carry its potluck_peer_state gauge
  potluck-healthcheck coordinator   GET /healthz on 127.0.0.1:$POTLUCK_DASHBOARD_PORT (8470): answered by the
                                    coordinator's event loop (the dashboard's server)

Exit 0: healthy; 1: unhealthy, with the reason on stdout (docker inspect shows it).
"""

import os
import sys
import urllib.request

CHECKS = {
    "peer": ("POTLUCK_METRICS_PORT", "9400", "/metrics", b"potluck_peer_state"),
    "coordinator": ("POTLUCK_DASHBOARD_PORT", "8470", "/healthz", b"ok"),
}


def main() -> int:
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role not in CHECKS:
        sys.stdout.write(f"usage: potluck-healthcheck {{{','.join(CHECKS)}}}\n")
        return 1
    env, default, path, expect = CHECKS[role]
    url = f"http://127.0.0.1:{os.environ.get(env, default)}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read(1 << 20)
    except OSError as e:  # refused, timed out, HTTP error status
        sys.stdout.write(f"{url}: {e}\n")
        return 1
    if expect not in body:
        sys.stdout.write(f"{url}: answered without {expect.decode()}\n")
        return 1
    sys.stdout.write(f"{url}: ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
