"""A home router's NAT for one emulated peer: the relay rewrites its packets as a masquerading router would.

A NATed peer's ``tun0`` holds a private address (``PRIVATE_ADDR``; every home gets the same one, as
real homes do) and the relay gives it the public address ``<subnet>.<i+1>``. Outbound packets get the
public address and a public port; inbound packets reach the peer only through a mapping it made, and
only from an endpoint it has sent to (address-and-port-dependent filtering: no port forwarding, no
UPnP). Two mapping behaviours, after RFC 4787:

- ``cone``: endpoint-independent mapping, the private port kept when free: the public address a peer
  is seen at is the same whoever looks, so libp2p's hole punching (DCUtR: both sides dial the other's
  observed address at once) opens a direct path;
- ``symmetric``: a fresh public port for every destination (carrier-grade and some corporate NATs):
  the address one peer observes is useless to another, so hole punching fails and only a relay helps.

Mappings expire after ``UDP_IDLE_S`` / ``TCP_IDLE_S`` without outbound traffic (RFC 4787 / RFC 5382
minimums); at most ``MAX_MAPPINGS`` live at once, as a router's table is finite. Checksums are patched
incrementally (RFC 1624), so a rewrite costs the same for a 40-byte ACK and a 1500-byte segment.
ICMP echo keeps its identifier; other ICMP and IP fragments past the first are dropped inbound.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

PRIVATE_ADDR = "192.168.1.2"
KINDS = ("cone", "symmetric")
TCP, UDP, ICMP = 6, 17, 1
UDP_IDLE_S = 120.0  # RFC 4787 REQ-5: at least 2 minutes
TCP_IDLE_S = 7440.0  # RFC 5382 REQ-5: at least 2 h 4 min for established connections
MAX_MAPPINGS = 4096
FIRST_PORT = 20000  # where a symmetric NAT (or a cone NAT whose port is taken) starts allocating
ECHO_REQUEST, ECHO_REPLY = 8, 0


def _fold(x: int) -> int:
    while x > 0xFFFF:
        x = (x & 0xFFFF) + (x >> 16)
    return x


def _words(b: bytes) -> int:
    """One's-complement sum of the 16-bit words of an even-length byte string."""
    return _fold(sum(struct.unpack(f"!{len(b) // 2}H", b)))


def patch_checksum(csum: int, old: bytes, new: bytes) -> int:
    """RFC 1624 eqn. 3: the checksum after the bytes ``old`` (even length) become ``new``."""
    return ~_fold((~csum & 0xFFFF) + (~_words(old) & 0xFFFF) + _words(new)) & 0xFFFF


def ip_addr(text: str) -> bytes:
    return bytes(int(x) for x in text.split("."))


@dataclass
class Mapping:
    proto: int
    private_port: int
    public_port: int
    seen: set[tuple[bytes, int]] = field(default_factory=set)  # endpoints the peer has sent to
    last_out: float = 0.0


@dataclass
class NatStats:
    translated_out: int = 0
    translated_in: int = 0
    filtered: int = 0  # unsolicited inbound packets dropped (no mapping, or from an endpoint not sent to)
    table_full: int = 0
    unsupported: int = 0


class HomeNat:
    """The NAT of one peer's home router (``kind`` in ``KINDS``); pure: no I/O, time passed in."""

    def __init__(self, kind: str, public: bytes, private: bytes = ip_addr(PRIVATE_ADDR)) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown NAT kind {kind!r} (known: {', '.join(KINDS)})")
        self.kind, self.public, self.private = kind, public, private
        self.out: dict[tuple[int, ...] | tuple[int, int, bytes, int], Mapping] = {}
        self.by_public: dict[tuple[int, int], Mapping] = {}
        self._next_port = FIRST_PORT
        self.stats = NatStats()

    # ---- the peer sends ------------------------------------------------------------------------------

    def outbound(self, pkt: bytes, now: float) -> bytes | None:
        """The packet as it leaves the router (public source), or None when it cannot be mapped."""
        if len(pkt) < 20 or pkt[0] >> 4 != 4 or pkt[12:16] != self.private:
            self.stats.unsupported += 1
            return None
        ihl = (pkt[0] & 0x0F) * 4
        proto = pkt[9]
        buf = bytearray(pkt)
        _set_ip_src(buf, self.public)
        if proto in (TCP, UDP) and len(pkt) >= ihl + 8 and not _later_fragment(pkt):
            sport = struct.unpack_from("!H", pkt, ihl)[0]
            dst = (pkt[16:20], struct.unpack_from("!H", pkt, ihl + 2)[0])
            m = self._mapping(proto, sport, dst, now)
            if m is None:
                return None
            m.seen.add(dst)
            m.last_out = now
            _set_l4_port(buf, ihl, proto, 0, m.public_port, self.private, self.public)
        elif proto == ICMP and len(pkt) >= ihl + 8 and pkt[ihl] == ECHO_REQUEST:
            ident = struct.unpack_from("!H", pkt, ihl + 4)[0]
            m = self._mapping(ICMP, ident, (pkt[16:20], 0), now)
            if m is None:
                return None
            m.seen.add((pkt[16:20], 0))
            m.last_out = now
        self.stats.translated_out += 1
        return bytes(buf)

    def _mapping(self, proto: int, port: int, dst: tuple[bytes, int], now: float) -> Mapping | None:
        key: tuple[int, ...] | tuple[int, int, bytes, int] = (
            (proto, port) if self.kind == "cone" or proto == ICMP else (proto, port, dst[0], dst[1])
        )
        m = self.out.get(key)
        if m is not None and not self._expired(m, now):
            return m
        if m is not None:
            self._drop(key, m)
        if len(self.out) >= MAX_MAPPINGS:
            self._sweep(now)
            if len(self.out) >= MAX_MAPPINGS:
                self.stats.table_full += 1
                return None
        keep = len(key) == 2 and (proto, port) not in self.by_public  # a cone NAT preserves the port
        public_port = port if keep else self._free_port(proto)
        m = Mapping(proto, port, public_port, last_out=now)
        self.out[key] = m
        self.by_public[(proto, public_port)] = m
        return m

    def _free_port(self, proto: int) -> int:
        for _ in range(65536 - FIRST_PORT):
            port = self._next_port
            self._next_port = FIRST_PORT if port >= 65535 else port + 1
            if (proto, port) not in self.by_public:
                return port
        raise RuntimeError("no free public port")  # unreachable below MAX_MAPPINGS

    @staticmethod
    def _expired(m: Mapping, now: float) -> bool:
        return now - m.last_out > (TCP_IDLE_S if m.proto == TCP else UDP_IDLE_S)

    def _drop(self, key: tuple[int, ...] | tuple[int, int, bytes, int], m: Mapping) -> None:
        del self.out[key]
        if self.by_public.get((m.proto, m.public_port)) is m:
            del self.by_public[(m.proto, m.public_port)]

    def _sweep(self, now: float) -> None:
        for key, m in [(k, m) for k, m in self.out.items() if self._expired(m, now)]:
            self._drop(key, m)

    # ---- the peer receives ---------------------------------------------------------------------------

    def inbound(self, pkt: bytes, now: float) -> bytes | None:
        """The packet as the router hands it to the peer, or None when the router drops it."""
        if len(pkt) < 20 or pkt[0] >> 4 != 4 or pkt[16:20] != self.public:
            self.stats.unsupported += 1
            return None
        ihl = (pkt[0] & 0x0F) * 4
        proto = pkt[9]
        src = pkt[12:16]
        if _later_fragment(pkt) or len(pkt) < ihl + 8:
            self.stats.unsupported += 1
            return None
        if proto in (TCP, UDP):
            sport, dport = struct.unpack_from("!HH", pkt, ihl)
            endpoint = (src, sport)
        elif proto == ICMP and pkt[ihl] == ECHO_REPLY:
            dport = struct.unpack_from("!H", pkt, ihl + 4)[0]
            endpoint = (src, 0)
        else:
            self.stats.unsupported += 1
            return None
        m = self.by_public.get((proto, dport))
        if m is None or self._expired(m, now) or endpoint not in m.seen:
            self.stats.filtered += 1
            return None
        buf = bytearray(pkt)
        _set_ip_dst(buf, self.private)
        if proto != ICMP:
            _set_l4_port(buf, ihl, proto, 2, m.private_port, self.public, self.private)
        self.stats.translated_in += 1
        return bytes(buf)


def _later_fragment(pkt: bytes) -> bool:
    return bool(struct.unpack_from("!H", pkt, 6)[0] & 0x1FFF)


def _set_ip_src(buf: bytearray, addr: bytes) -> None:
    _set_ip_addr(buf, 12, addr)


def _set_ip_dst(buf: bytearray, addr: bytes) -> None:
    _set_ip_addr(buf, 16, addr)


def _set_ip_addr(buf: bytearray, at: int, addr: bytes) -> None:
    old = bytes(buf[at : at + 4])
    csum = struct.unpack_from("!H", buf, 10)[0]
    struct.pack_into("!H", buf, 10, patch_checksum(csum, old, addr))
    buf[at : at + 4] = addr


def _set_l4_port(
    buf: bytearray, ihl: int, proto: int, which: int, port: int, old_addr: bytes, new_addr: bytes
) -> None:
    """Set the source (``which`` 0) or destination (2) port and patch the TCP/UDP checksum for the port
    and the pseudo-header's address change (the IP header was already rewritten)."""
    at = ihl + (16 if proto == TCP else 6)
    old_port = bytes(buf[ihl + which : ihl + which + 2])
    new_port = struct.pack("!H", port)
    buf[ihl + which : ihl + which + 2] = new_port
    if len(buf) < at + 2:
        return
    csum = struct.unpack_from("!H", buf, at)[0]
    if proto == UDP and csum == 0:
        return  # no checksum sent: nothing to patch
    new = patch_checksum(csum, old_addr + old_port, new_addr + new_port)
    struct.pack_into("!H", buf, at, 0xFFFF if proto == UDP and new == 0 else new)
