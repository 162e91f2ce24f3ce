"""The WAN testbed's emulated home routers on real namespaces: device 0 is public, device 1 sits behind a
cone NAT and device 2 behind a symmetric one (``potluck.testbed.wan.nat``, applied by the relay).

Small stdlib-only Python programs run in the namespaces (``WanLab.spawn``) and say what they saw as JSON
lines on stdout. Needs root, /dev/net/tun and iproute2; skipped otherwise.
"""

import json
import select
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from potluck.testbed.wan.lab import WanLab
from potluck.testbed.wan.nat import FIRST_PORT, PRIVATE_ADDR
from potluck.testbed.wan.spec import spec_from_dict, with_nat
from tests.helpers.wanlab import NEEDS_WAN_TESTBED

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    *NEEDS_WAN_TESTBED,
]

CONE, SYMMETRIC = 1, 2

# One program for every role; argv[1] names it. Each prints JSON lines and flushes them.
AGENT = r"""
import json, socket, sys, time

def say(**kw):
    print(json.dumps(kw), flush=True)

role, args = sys.argv[1], sys.argv[2:]
if role == "tcp-echo-server":  # host port: echo each connection's data back, report who connected
    srv = socket.create_server((args[0], int(args[1])))
    say(ready=True)
    while True:
        conn, peer = srv.accept()
        with conn:
            data = conn.recv(1000)
            conn.sendall(data)
            say(peer=list(peer), data=data.decode())
elif role == "tcp-client":  # bind_host bind_port dst_host dst_port timeout
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((args[0], int(args[1])))
    s.settimeout(float(args[4]))
    start = time.monotonic()
    try:
        s.connect((args[2], int(args[3])))
        s.sendall(b"hello from " + args[0].encode() + b":" + args[1].encode())
        echo = s.recv(1000).decode()
        say(ok=True, echo=echo, local=list(s.getsockname()))
    except OSError as exc:
        say(ok=False, error=type(exc).__name__, after_s=time.monotonic() - start)
elif role == "udp-server":  # host port other_port: reply to the first datagram's source from both ports
    main = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    main.bind((args[0], int(args[1])))
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind((args[0], int(args[2])))
    say(ready=True)
    main.settimeout(10)
    data, peer = main.recvfrom(1000)
    other.sendto(b"stranger", peer)  # another port of the same host: the router must drop it
    main.sendto(b"reply to " + data, peer)
    say(peer=list(peer))
elif role == "udp-client":  # bind_host bind_port dst_host dst_port
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((args[0], int(args[1])))
    s.sendto(b"hello", (args[2], int(args[3])))
    got = []
    s.settimeout(5)
    try:
        while True:
            got.append(s.recvfrom(1000)[0].decode())
            s.settimeout(1.0)  # after the first, wait a while for anything else
    except socket.timeout:
        pass
    say(got=got)
elif role == "udp-observe":  # host port1 port2: report the source of one datagram on each port
    socks = []
    for p in args[1:]:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind((args[0], int(p)))
        u.settimeout(10)
        socks.append(u)
    say(ready=True)
    say(peers=[list(u.recvfrom(1000)[1]) for u in socks])
elif role == "udp-send-twice":  # bind_host bind_port dst_host port1 port2
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((args[0], int(args[1])))
    for p in args[3:]:
        s.sendto(b"x", (args[2], int(p)))
    say(sent=True)
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[WanLab]:
    n = 3
    raw = {
        "name": "nat-3",
        "devices": [{"id": i} for i in range(n)],
        "links": {
            "latency_ms": [[0 if a == b else 5 for b in range(n)] for a in range(n)],
            "bandwidth_gbps": [[0 if a == b else 0.05 for b in range(n)] for a in range(n)],
        },
    }
    spec = with_nat(spec_from_dict(raw), {CONE: "cone", SYMMETRIC: "symmetric"})
    with WanLab(spec) as wan:
        yield wan
    assert wan.leftovers() == []


def start(lab: WanLab, i: int, *args: object) -> subprocess.Popen[str]:
    return lab.spawn(
        i,
        [sys.executable, "-c", AGENT, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def line(proc: subprocess.Popen[str], timeout_s: float = 10.0) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    text = proc.stdout.readline() if ready else ""
    if not text:
        proc.kill()
        err = proc.stderr.read() if proc.stderr is not None else ""
        pytest.fail(f"agent said nothing within {timeout_s} s: {err[-2000:]}")
    out: dict[str, Any] = json.loads(text)
    return out


def test_natted_peers_dial_out_and_are_seen_at_their_public_address(lab: WanLab) -> None:
    assert lab.natted() == [CONE, SYMMETRIC]
    assert lab.local_addr(CONE) == lab.local_addr(SYMMETRIC) == PRIVATE_ADDR  # every home's address
    server = start(lab, 0, "tcp-echo-server", lab.addr(0), 7000)
    assert line(server) == {"ready": True}
    seen = {}
    for i, port in ((CONE, 40001), (SYMMETRIC, 40002)):
        client = start(lab, i, "tcp-client", lab.local_addr(i), port, lab.addr(0), 7000, 5)
        got = line(client)
        assert got["ok"], got
        assert got["echo"] == f"hello from {PRIVATE_ADDR}:{port}"
        assert got["local"] == [PRIVATE_ADDR, port]  # the peer itself sees only its private address
        conn = line(server)
        assert conn["data"] == got["echo"]
        seen[i] = tuple(conn["peer"])
        client.wait(5)
    assert seen[CONE] == (lab.addr(CONE), 40001)  # the cone router kept the port
    host, port = seen[SYMMETRIC]
    assert host == lab.addr(SYMMETRIC) == "10.79.0.3"
    assert port != 40002 and FIRST_PORT <= port <= 65535  # the symmetric one picked a port of its own


def test_nobody_can_dial_into_a_natted_peer(lab: WanLab) -> None:
    server = start(lab, CONE, "tcp-echo-server", lab.local_addr(CONE), 7100)
    assert line(server) == {"ready": True}
    # the listener is there: from inside its own namespace it answers
    local = start(lab, CONE, "tcp-client", lab.local_addr(CONE), 40100, lab.local_addr(CONE), 7100, 3)
    assert line(local)["ok"]
    assert line(server)["data"].startswith("hello")
    # from outside, at the router's address, the SYNs are dropped unsolicited: the dial times out
    dial = start(lab, 0, "tcp-client", lab.addr(0), 40101, lab.addr(CONE), 7100, 3)
    got = line(dial, 15)
    assert got == {"ok": False, "error": "TimeoutError", "after_s": pytest.approx(3.0, abs=1.0)}
    assert server.poll() is None
    assert server.stdout is not None
    ready, _, _ = select.select([server.stdout], [], [], 0.2)
    assert not ready  # the server never saw a connection


@pytest.mark.parametrize("i", [CONE, SYMMETRIC])
def test_udp_replies_reach_a_natted_peer_but_strangers_do_not(lab: WanLab, i: int) -> None:
    port = 9000 + 10 * i
    server = start(lab, 0, "udp-server", lab.addr(0), port, port + 1)
    assert line(server) == {"ready": True}
    client = start(lab, i, "udp-client", lab.local_addr(i), 7000 + i, lab.addr(0), port)
    peer = line(server)["peer"]
    assert peer[0] == lab.addr(i)
    assert (peer[1] == 7000 + i) == (i == CONE)
    # the stranger's datagram was sent first, over the same links: had it passed, it would come first
    assert line(client, 15) == {"got": ["reply to hello"]}


@pytest.mark.parametrize("i", [CONE, SYMMETRIC])
def test_one_socket_is_seen_at_one_port_behind_a_cone_and_at_two_behind_a_symmetric_nat(
    lab: WanLab, i: int
) -> None:
    ports = (9100 + 10 * i, 9101 + 10 * i)
    observer = start(lab, 0, "udp-observe", lab.addr(0), *ports)
    assert line(observer) == {"ready": True}
    sender = start(lab, i, "udp-send-twice", lab.local_addr(i), 7100 + i, lab.addr(0), *ports)
    assert line(sender) == {"sent": True}
    peers = [tuple(p) for p in line(observer)["peers"]]
    assert {host for host, _ in peers} == {lab.addr(i)}
    if i == CONE:
        assert peers == [(lab.addr(i), 7100 + i)] * 2
    else:
        assert peers[0][1] != peers[1][1] and 7100 + i not in (peers[0][1], peers[1][1])
