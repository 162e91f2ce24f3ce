"""The emulated home router (``potluck.testbed.wan.nat``) on hand-built IPv4 packets (no network, no root).

Every packet here is built from scratch, checksums included (IPv4 header; TCP/UDP over the pseudo-header),
so a translated packet can be compared byte for byte with the packet a real stack would have sent from
the translated address and port.
"""

import os
import random
import socket
import struct
import threading
import time

import pytest

from potluck.testbed.errors import TestbedError
from potluck.testbed.wan import nat as natmod
from potluck.testbed.wan.lab import WanLab
from potluck.testbed.wan.nat import FIRST_PORT, TCP_IDLE_S, UDP_IDLE_S, HomeNat, ip_addr
from potluck.testbed.wan.relay import Relay
from potluck.testbed.wan.sched import INF, scheduler_for
from potluck.testbed.wan.spec import spec_from_dict, with_nat

PRIVATE = ip_addr("192.168.1.2")
PUBLIC = ip_addr("10.79.0.2")
A = ip_addr("10.79.0.1")  # a public peer
B = ip_addr("10.79.0.4")  # another one
TCP, UDP, ICMP = 6, 17, 1

# ---- packets, from scratch ---------------------------------------------------------------------------


def ones_sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def internet_checksum(data: bytes) -> int:
    return ~ones_sum(data) & 0xFFFF


def ipv4(
    src: bytes,
    dst: bytes,
    proto: int,
    payload: bytes,
    frag: int = 0,
    options: bytes = b"",
    ident: int = 0x1234,
) -> bytes:
    assert len(options) % 4 == 0
    ihl = 5 + len(options) // 4
    head = struct.pack(
        "!BBHHHBBH4s4s", 0x40 | ihl, 0, 4 * ihl + len(payload), ident, frag, 64, proto, 0, src, dst
    )
    head += options
    csum = internet_checksum(head)
    return head[:10] + struct.pack("!H", csum) + head[12:] + payload


def l4_checksum(src: bytes, dst: bytes, proto: int, segment: bytes) -> int:
    pseudo = src + dst + struct.pack("!BBH", 0, proto, len(segment))
    return internet_checksum(pseudo + segment)


def tcp(src: bytes, dst: bytes, sport: int, dport: int, payload: bytes = b"", **ip: object) -> bytes:
    head = struct.pack("!HHIIBBHHH", sport, dport, 1000, 2000, 5 << 4, 0x18, 65535, 0, 0)
    csum = l4_checksum(src, dst, TCP, head + payload)
    seg = head[:16] + struct.pack("!H", csum) + head[18:] + payload
    return ipv4(src, dst, TCP, seg, **ip)  # type: ignore[arg-type]


def udp(
    src: bytes,
    dst: bytes,
    sport: int,
    dport: int,
    payload: bytes = b"",
    no_checksum: bool = False,
    **ip: object,
) -> bytes:
    head = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    csum = 0 if no_checksum else (l4_checksum(src, dst, UDP, head + payload) or 0xFFFF)
    seg = head[:6] + struct.pack("!H", csum) + payload
    return ipv4(src, dst, UDP, seg, **ip)  # type: ignore[arg-type]


def icmp_echo(src: bytes, dst: bytes, kind: int, ident: int, seq: int = 1, payload: bytes = b"ping") -> bytes:
    head = struct.pack("!BBHHH", kind, 0, 0, ident, seq)
    csum = internet_checksum(head + payload)
    return ipv4(src, dst, ICMP, head[:2] + struct.pack("!H", csum) + head[4:] + payload)


def ports(pkt: bytes) -> tuple[int, int]:
    ihl = (pkt[0] & 0x0F) * 4
    sport, dport = struct.unpack_from("!HH", pkt, ihl)
    return sport, dport


def assert_checksums_valid(pkt: bytes) -> None:
    ihl = (pkt[0] & 0x0F) * 4
    assert ones_sum(pkt[:ihl]) == 0xFFFF, "bad IPv4 header checksum"
    proto, src, dst, seg = pkt[9], pkt[12:16], pkt[16:20], pkt[ihl:]
    if proto in (TCP, UDP):
        at = 16 if proto == TCP else 6
        stored = struct.unpack_from("!H", seg, at)[0]
        if proto == UDP and stored == 0:
            return
        fresh = l4_checksum(src, dst, proto, seg[:at] + b"\0\0" + seg[at + 2 :])
        if proto == UDP:
            fresh = fresh or 0xFFFF  # RFC 768: a computed 0 is sent as all ones
        assert stored == fresh, f"bad checksum (protocol {proto})"


def test_the_packet_builders_agree_with_a_known_header():
    # The IPv4 header example of RFC 1071's usual worked case (Wikipedia's): checksum 0xb861.
    head = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")
    assert internet_checksum(head) == 0xB861
    pkt = udp(PRIVATE, A, 5000, 80, b"abc")
    assert_checksums_valid(pkt)
    assert_checksums_valid(tcp(PRIVATE, A, 5000, 80, b"abcde"))
    with pytest.raises(AssertionError):
        assert_checksums_valid(pkt[:-1] + bytes([pkt[-1] ^ 1]))  # the check itself can fail


# ---- mapping -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [tcp, udp])
def test_cone_keeps_the_port_and_reuses_it_for_every_destination(build):
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    out_a = nat.outbound(build(PRIVATE, A, 5000, 80, b"hi"), 0.0)
    out_b = nat.outbound(build(PRIVATE, B, 5000, 443, b"hi"), 0.0)
    assert out_a == build(PUBLIC, A, 5000, 80, b"hi")  # source address rewritten, port kept
    assert out_b == build(PUBLIC, B, 5000, 443, b"hi")  # the same public port for another destination
    out_c = nat.outbound(build(PRIVATE, A, 5001, 80, b"hi"), 0.0)
    assert out_c is not None and ports(out_c) == (5001, 80)
    assert nat.stats.translated_out == 3


@pytest.mark.parametrize("build", [tcp, udp])
def test_symmetric_gives_each_destination_its_own_port(build):
    nat = HomeNat("symmetric", PUBLIC, PRIVATE)
    seen = []
    for dst, dport in ((A, 80), (A, 81), (B, 80), (A, 80)):
        out = nat.outbound(build(PRIVATE, dst, 5000, dport), 0.0)
        assert out is not None and out[12:16] == PUBLIC and out[16:20] == dst
        assert_checksums_valid(out)
        seen.append(ports(out)[0])
    assert seen[0] == FIRST_PORT
    assert len(set(seen[:3])) == 3 and all(p >= FIRST_PORT for p in seen)
    assert seen[3] == seen[0]  # the same destination again: the same mapping
    assert nat.outbound(build(PRIVATE, A, 5000, 80), 0.0) == build(PUBLIC, A, FIRST_PORT, 80)


def random_addr(rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(4))


@pytest.mark.parametrize("kind", ["cone", "symmetric"])
def test_checksums_equal_a_full_recomputation_after_every_rewrite(kind):
    rng = random.Random(f"nat-checksums-{kind}")
    edge_ports = [0, 1, 0xFFFF, 0xFFFE, 0x8000, 0x00FF, 0xFF00]
    for _ in range(1500):
        private, public, peer = random_addr(rng), random_addr(rng), random_addr(rng)
        if peer == public:
            continue
        nat = HomeNat(kind, public, private)
        build = rng.choice([tcp, udp])
        sport = rng.choice(edge_ports) if rng.random() < 0.2 else rng.randrange(65536)
        dport = rng.choice(edge_ports) if rng.random() < 0.2 else rng.randrange(65536)
        payload = rng.randbytes(rng.randrange(0, 80))  # odd and even lengths, empty too
        options = b"\x01" * 4 * rng.randrange(3)  # NOP options: a longer header moves the ports
        now = rng.uniform(0, 1e6)
        sent = build(private, peer, sport, dport, payload, options=options)
        out = nat.outbound(sent, now)
        assert out is not None
        public_port = ports(out)[0]
        assert out == build(public, peer, public_port, dport, payload, options=options)
        assert_checksums_valid(out)
        if kind == "cone":
            assert public_port == sport
        reply = build(peer, public, dport, public_port, payload[::-1], options=options)
        back = nat.inbound(reply, now + 1)
        assert back == build(peer, private, dport, sport, payload[::-1], options=options)
        assert_checksums_valid(back)


@pytest.mark.parametrize("kind", ["cone", "symmetric"])
def test_a_udp_checksum_of_zero_stays_zero(kind):
    nat = HomeNat(kind, PUBLIC, PRIVATE)
    out = nat.outbound(udp(PRIVATE, A, 5000, 53, b"query", no_checksum=True), 0.0)
    assert out is not None and out[26:28] == b"\0\0"
    public_port = ports(out)[0]
    assert out == udp(PUBLIC, A, public_port, 53, b"query", no_checksum=True)
    back = nat.inbound(udp(A, PUBLIC, 53, public_port, b"answer", no_checksum=True), 0.0)
    assert back == udp(A, PRIVATE, 53, 5000, b"answer", no_checksum=True)


def test_a_udp_checksum_that_comes_out_zero_is_sent_as_all_ones():
    """Find a datagram whose translated checksum computes to 0: it must go out as 0xFFFF (RFC 768)."""
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    for n in range(65536):
        payload = struct.pack("!H", n)
        want = udp(PUBLIC, A, 5000, 53, payload)
        if want[26:28] == b"\xff\xff":
            break
    else:
        pytest.fail("no datagram with a zero checksum found")
    out = nat.outbound(udp(PRIVATE, A, 5000, 53, payload), 0.0)
    assert out == want


# ---- filtering ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [tcp, udp])
def test_inbound_passes_only_from_an_endpoint_the_peer_has_sent_to(build):
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    assert nat.outbound(build(PRIVATE, A, 5000, 80, b"x"), 0.0) is not None
    back = nat.inbound(build(A, PUBLIC, 80, 5000, b"reply"), 1.0)
    assert back == build(A, PRIVATE, 80, 5000, b"reply")
    assert nat.stats.translated_in == 1 and nat.stats.filtered == 0
    assert nat.inbound(build(A, PUBLIC, 81, 5000, b"other port"), 1.0) is None
    assert nat.inbound(build(B, PUBLIC, 80, 5000, b"other host"), 1.0) is None
    assert nat.inbound(build(ip_addr("10.79.0.9"), PUBLIC, 80, 5000), 1.0) is None
    assert nat.inbound(build(A, PUBLIC, 80, 5001, b"unmapped"), 1.0) is None
    assert nat.stats.filtered == 4 and nat.stats.translated_in == 1
    # once the peer has sent to B:80 too, B:80 gets through on the same (cone) mapping
    assert nat.outbound(build(PRIVATE, B, 5000, 80), 2.0) is not None
    assert nat.inbound(build(B, PUBLIC, 80, 5000, b"now"), 2.0) == build(B, PRIVATE, 80, 5000, b"now")


def test_symmetric_inbound_only_from_the_destination_of_that_mapping():
    nat = HomeNat("symmetric", PUBLIC, PRIVATE)
    pa = ports(nat.outbound(udp(PRIVATE, A, 5000, 80), 0.0) or b"")[0]
    pb = ports(nat.outbound(udp(PRIVATE, B, 5000, 80), 0.0) or b"")[0]
    assert pa != pb
    assert nat.inbound(udp(A, PUBLIC, 80, pa, b"a"), 0.0) == udp(A, PRIVATE, 80, 5000, b"a")
    assert nat.inbound(udp(B, PUBLIC, 80, pb, b"b"), 0.0) == udp(B, PRIVATE, 80, 5000, b"b")
    assert nat.inbound(udp(B, PUBLIC, 80, pa), 0.0) is None  # B on A's mapping
    assert nat.inbound(udp(A, PUBLIC, 80, pb), 0.0) is None
    assert nat.inbound(udp(A, PUBLIC, 80, 5000), 0.0) is None  # the private port is not mapped
    assert nat.stats.filtered == 3


def test_tcp_and_udp_mappings_are_separate():
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    assert nat.outbound(udp(PRIVATE, A, 5000, 80), 0.0) is not None
    assert nat.inbound(tcp(A, PUBLIC, 80, 5000), 0.0) is None
    assert nat.stats.filtered == 1


# ---- expiry and the table's size ---------------------------------------------------------------------


def test_udp_mappings_expire_after_the_idle_time_and_outbound_traffic_refreshes_them():
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    assert nat.outbound(udp(PRIVATE, A, 5000, 80), 0.0) is not None
    assert nat.inbound(udp(A, PUBLIC, 80, 5000), UDP_IDLE_S - 1) is not None
    assert nat.outbound(udp(PRIVATE, A, 5000, 80), 100.0) is not None  # refresh
    assert nat.inbound(udp(A, PUBLIC, 80, 5000), 100.0 + UDP_IDLE_S - 1) is not None
    assert nat.inbound(udp(A, PUBLIC, 80, 5000), 100.0 + UDP_IDLE_S + 1) is None
    assert nat.stats.filtered == 1


def test_inbound_traffic_alone_does_not_keep_a_mapping_alive():
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    assert nat.outbound(udp(PRIVATE, A, 5000, 80), 0.0) is not None
    for t in range(10, int(UDP_IDLE_S), 10):
        assert nat.inbound(udp(A, PUBLIC, 80, 5000), float(t)) is not None
    assert nat.inbound(udp(A, PUBLIC, 80, 5000), UDP_IDLE_S + 1) is None


def test_tcp_mappings_outlive_udp_ones_but_expire_too():
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    assert nat.outbound(tcp(PRIVATE, A, 5000, 80), 0.0) is not None
    assert nat.inbound(tcp(A, PUBLIC, 80, 5000), UDP_IDLE_S + 10) is not None
    assert nat.inbound(tcp(A, PUBLIC, 80, 5000), TCP_IDLE_S - 1) is not None
    assert nat.inbound(tcp(A, PUBLIC, 80, 5000), TCP_IDLE_S + 1) is None


def test_an_expired_mapping_forgets_the_endpoints_it_was_open_to():
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    assert nat.outbound(udp(PRIVATE, A, 5000, 80), 0.0) is not None
    later = UDP_IDLE_S + 50
    out = nat.outbound(udp(PRIVATE, B, 5000, 80), later)  # a fresh mapping, same port (cone)
    assert out is not None and ports(out)[0] == 5000
    assert nat.inbound(udp(B, PUBLIC, 80, 5000), later) is not None
    assert nat.inbound(udp(A, PUBLIC, 80, 5000), later) is None


@pytest.mark.parametrize("kind", ["cone", "symmetric"])
def test_a_full_table_refuses_new_mappings_until_old_ones_expire(monkeypatch, kind):
    monkeypatch.setattr(natmod, "MAX_MAPPINGS", 3)
    nat = HomeNat(kind, PUBLIC, PRIVATE)
    # cone: a mapping per private port; symmetric: one per destination
    flows = [(A, 80, 5000 + k) if kind == "cone" else (A, 80 + k, 5000) for k in range(4)]
    for dst, dport, sport in flows[:3]:
        assert nat.outbound(udp(PRIVATE, dst, sport, dport), 0.0) is not None
    dst, dport, sport = flows[3]
    assert nat.outbound(udp(PRIVATE, dst, sport, dport), 1.0) is None
    assert nat.stats.table_full == 1
    # mappings already made still work both ways
    first = nat.outbound(udp(PRIVATE, flows[0][0], flows[0][2], flows[0][1]), 2.0)
    assert first is not None
    assert nat.inbound(udp(A, PUBLIC, flows[0][1], ports(first)[0]), 2.0) is not None
    # the two others idle out (the first was refreshed at 2.0); the sweep then makes room
    later = UDP_IDLE_S + 1
    assert nat.outbound(udp(PRIVATE, dst, sport, dport), later) is not None
    assert nat.stats.table_full == 1
    assert len(nat.out) == 2
    assert nat.inbound(udp(A, PUBLIC, flows[0][1], ports(first)[0]), later) is not None


def test_a_full_table_counts_every_refusal(monkeypatch):
    monkeypatch.setattr(natmod, "MAX_MAPPINGS", 2)
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    for sport in (1, 2):
        assert nat.outbound(tcp(PRIVATE, A, sport, 80), 0.0) is not None
    for sport in (3, 4, 5):
        assert nat.outbound(tcp(PRIVATE, A, sport, 80), 0.0) is None
    assert nat.stats.table_full == 3 and nat.stats.translated_out == 2


# ---- what the router refuses ---------------------------------------------------------------------------


def test_packets_not_from_the_private_address_are_refused():
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    assert nat.outbound(udp(ip_addr("192.168.1.3"), A, 5000, 80), 0.0) is None
    assert nat.outbound(udp(PUBLIC, A, 5000, 80), 0.0) is None  # already public: spoofed
    assert nat.stats.unsupported == 2 and nat.stats.translated_out == 0
    assert nat.out == {}


def test_non_ipv4_and_truncated_packets_are_refused():
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    v4 = udp(PRIVATE, A, 5000, 80, b"data")
    v6 = bytes([0x60]) + v4[1:]
    assert nat.outbound(v6, 0.0) is None
    assert nat.outbound(v4[:19], 0.0) is None
    assert nat.outbound(b"", 0.0) is None
    assert nat.outbound(v4, 0.0) is not None
    reply = udp(A, PUBLIC, 80, 5000)
    assert nat.inbound(bytes([0x60]) + reply[1:], 0.0) is None
    assert nat.inbound(reply[:19], 0.0) is None
    assert nat.inbound(reply[:24], 0.0) is None  # no room for the ports
    assert nat.inbound(udp(A, ip_addr("10.79.0.3"), 80, 5000), 0.0) is None  # someone else's address
    assert nat.stats.unsupported == 7
    assert nat.inbound(reply, 0.0) is not None


@pytest.mark.parametrize("build", [tcp, udp])
def test_later_fragments_are_refused_inbound(build):
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    assert nat.outbound(build(PRIVATE, A, 5000, 80), 0.0) is not None
    whole = build(A, PUBLIC, 80, 5000, b"x" * 16)
    assert nat.inbound(whole, 0.0) is not None
    later = build(A, PUBLIC, 80, 5000, b"x" * 16, frag=185)  # offset 185 * 8 bytes
    assert nat.inbound(later, 0.0) is None
    last_with_df = build(A, PUBLIC, 80, 5000, b"x" * 16, frag=0x4000 | 1)
    assert nat.inbound(last_with_df, 0.0) is None
    assert nat.stats.unsupported == 2 and nat.stats.translated_in == 1
    first = build(A, PUBLIC, 80, 5000, b"x" * 16, frag=0x2000)  # more fragments, offset 0: has the ports
    assert nat.inbound(first, 0.0) is not None


def test_a_later_fragment_outbound_makes_no_mapping():
    nat = HomeNat("cone", PUBLIC, PRIVATE)
    # the bytes where ports would be are payload of a later fragment: they must not open a mapping
    frag = udp(PRIVATE, A, 5000, 80, b"x" * 16, frag=3)
    out = nat.outbound(frag, 0.0)
    assert out is None or (out[12:16] == PUBLIC and out[20:] == frag[20:])
    assert nat.out == {}
    assert nat.inbound(udp(A, PUBLIC, 80, 5000), 0.0) is None


# ---- ICMP echo -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cone", "symmetric"])
def test_icmp_echo_round_trips_and_unsolicited_requests_are_dropped(kind):
    nat = HomeNat(kind, PUBLIC, PRIVATE)
    out = nat.outbound(icmp_echo(PRIVATE, A, 8, ident=0x4242, payload=b"abcde"), 0.0)
    assert out == icmp_echo(PUBLIC, A, 8, ident=0x4242, payload=b"abcde")
    assert out is not None
    assert_checksums_valid(out)
    assert internet_checksum(out[20:]) == 0
    back = nat.inbound(icmp_echo(A, PUBLIC, 0, ident=0x4242, payload=b"abcde"), 0.5)
    assert back == icmp_echo(A, PRIVATE, 0, ident=0x4242, payload=b"abcde")
    assert back is not None
    assert_checksums_valid(back)
    assert nat.inbound(icmp_echo(B, PUBLIC, 0, ident=0x4242), 0.5) is None  # a reply from someone else
    assert nat.inbound(icmp_echo(A, PUBLIC, 0, ident=0x4343), 0.5) is None  # to another identifier
    assert nat.inbound(icmp_echo(A, PUBLIC, 8, ident=0x4242), 0.5) is None  # an echo request: dropped
    assert nat.inbound(icmp_echo(B, PUBLIC, 8, ident=7), 0.5) is None
    assert nat.inbound(icmp_echo(A, PUBLIC, 0, ident=0x4242), UDP_IDLE_S + 1) is None  # expired
    assert nat.stats.translated_in == 1


def test_unknown_kind_raises():
    with pytest.raises(ValueError, match="full-cone"):
        HomeNat("full-cone", PUBLIC, PRIVATE)
    with pytest.raises(ValueError):
        HomeNat("", PUBLIC, PRIVATE)


def test_patch_checksum_matches_recomputation():
    rng = random.Random(7)
    for _ in range(500):
        data = bytearray(rng.randbytes(2 * rng.randrange(2, 30)))
        csum = internet_checksum(bytes(data))
        at = 2 * rng.randrange(len(data) // 2)
        width = 2 * rng.randrange(1, (len(data) - at) // 2 + 1)
        old = bytes(data[at : at + width])
        new = rng.randbytes(width)
        data[at : at + width] = new
        assert natmod.patch_checksum(csum, old, new) == internet_checksum(bytes(data))


# ---- the relay applies it (socket pairs stand in for TUN fds) -----------------------------------------


def test_the_relay_translates_a_natted_peers_packets_and_drops_unsolicited_ones():
    prefix = bytes([10, 79, 0])
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2)]
    for inner, _ in pairs:
        inner.setblocking(False)
    zero = [[0.0, 0.0], [0.0, 0.0]]
    inf = [[INF, INF], [INF, INF]]
    relay = Relay(
        [p[0].fileno() for p in pairs],
        scheduler_for(zero, inf, [INF, INF], [INF, INF]),
        prefix,
        [None, HomeNat("symmetric", PUBLIC, PRIVATE)],
    )
    stop_r, stop_w = os.pipe()
    thread = threading.Thread(target=relay.serve, args=(stop_r,), daemon=True)
    thread.start()
    peer0, peer1 = pairs[0][1], pairs[1][1]
    try:
        peer0.settimeout(2)
        peer1.settimeout(2)
        peer0.send(udp(A, PUBLIC, 9, 9, b"unsolicited"))  # dropped by peer 1's router
        peer1.send(udp(PRIVATE, A, 5000, 80, b"out"))
        got = peer0.recv(2000)
        assert got == udp(PUBLIC, A, FIRST_PORT, 80, b"out")
        peer0.send(udp(A, PUBLIC, 80, FIRST_PORT, b"back"))
        assert peer1.recv(2000) == udp(A, PRIVATE, 80, 5000, b"back")
        deadline = time.monotonic() + 2
        while relay.stats.forwarded < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert relay.stats.dropped_nat == 1 and relay.stats.forwarded == 2
    finally:
        os.write(stop_w, b"x")
        thread.join(5)
        for a, b in pairs:
            a.close()
            b.close()
        os.close(stop_r)
        os.close(stop_w)


def test_the_relay_needs_one_nat_entry_per_device():
    with pytest.raises(ValueError):
        Relay(
            [0, 1],
            scheduler_for([[0, 0], [0, 0]], [[INF, INF], [INF, INF]], [INF, INF], [INF, INF]),
            bytes([10, 79, 0]),
            [None],
        )


# ---- scenario files and the lab's relay configuration ------------------------------------------------


def scenario(nats):
    n = len(nats)
    devices = [{"id": i} if v is ... else {"id": i, "nat": v} for i, v in enumerate(nats)]
    lat = [[0 if a == b else 5 for b in range(n)] for a in range(n)]
    bw = [[0 if a == b else 0.05 for b in range(n)] for a in range(n)]
    return {"name": "nat", "devices": devices, "links": {"latency_ms": lat, "bandwidth_gbps": bw}}


def test_scenario_devices_may_sit_behind_a_nat():
    spec = spec_from_dict(scenario([..., True, "symmetric", "cone", False, None]))
    assert [spec.nat_of(i) for i in range(6)] == ["", "cone", "symmetric", "cone", "", ""]
    plain = spec_from_dict(scenario([..., ...]))
    assert plain.nat == () and plain.nat_of(1) == ""


@pytest.mark.parametrize("bad", ["full-cone", "Cone", 1, ["cone"]])
def test_an_unknown_nat_in_a_scenario_says_so(bad):
    with pytest.raises(TestbedError, match=r"devices\[1\].*nat"):
        spec_from_dict(scenario([..., bad]))


def test_with_nat_puts_devices_behind_routers():
    spec = spec_from_dict(scenario([..., ..., ...]))
    natted = with_nat(spec, {1: "cone", 2: "symmetric"})
    assert [natted.nat_of(i) for i in range(3)] == ["", "cone", "symmetric"]
    assert spec.nat == ()  # the original is untouched
    back = with_nat(natted, {1: "", 2: ""})
    assert back.nat == ()
    assert with_nat(natted, {0: "cone"}).nat == ("cone", "cone", "symmetric")
    with pytest.raises(TestbedError, match="no device 3"):
        with_nat(spec, {3: "cone"})
    with pytest.raises(TestbedError):
        with_nat(spec, {-1: "cone"})


def test_with_nat_refuses_an_unknown_kind_with_a_testbed_error():
    spec = spec_from_dict(scenario([..., ...]))
    with pytest.raises(TestbedError):
        with_nat(spec, {1: "full-cone"})


def test_the_lab_tells_the_relay_which_devices_are_natted():
    spec = with_nat(spec_from_dict(scenario([..., ..., ...])), {1: "cone", 2: "symmetric"})
    lab = WanLab(spec, tag="plwtest")
    assert lab.relay_config()["nat"] == [None, "cone", "symmetric"]
    assert lab.natted() == [1, 2]
    assert [lab.addr(i) for i in range(3)] == ["10.79.0.1", "10.79.0.2", "10.79.0.3"]
    assert [lab.local_addr(i) for i in range(3)] == ["10.79.0.1", "192.168.1.2", "192.168.1.2"]
    plain = WanLab(spec_from_dict(scenario([..., ...])), tag="plwtest")
    assert plain.relay_config()["nat"] == [None, None]
    assert plain.natted() == [] and plain.local_addr(1) == "10.79.0.2"


def test_parse_nat_reads_device_kind_lists_and_refuses_garbage():
    from potluck.testbed.errors import TestbedError
    from potluck.testbed.wan.spec import parse_nat

    assert parse_nat("2:cone, 4:symmetric") == {2: "cone", 4: "symmetric"}
    assert parse_nat("3") == {3: "cone"} and parse_nat("") == {}
    with pytest.raises(TestbedError, match="DEVICE"):
        parse_nat("two:cone")
