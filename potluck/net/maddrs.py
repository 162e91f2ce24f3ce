"""Multiaddrs as p2pd reads them: the /p2p/ parts of relay circuits (no import of the node, so the
dialer, the relay self-test and the node all use it)."""

from __future__ import annotations

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

P2P_CODE = 421  # the multiaddr protocol code of /p2p/


class WireMaddr:
    """A multiaddr with /p2p/ parts (a relay circuit), encoded as p2pd decodes it.

    hivemind 1.1.12's multiaddr codec writes a /p2p/ part of an Ed25519 peer id as a CIDv1 (its string
    is not one of the CIDv0 shapes it knows), where go-multiaddr expects the bare multihash; p2pd then
    refuses the whole address ("length greater than remaining number of bytes"). So each /p2p/ part is
    written here as varint(421) varint(len) multihash, and the parts between by hivemind's codec."""

    def __init__(self, text: str) -> None:
        out = b""
        for i, part in enumerate(text.split("/p2p/")):
            rest = part
            if i > 0:
                peer, _, tail = part.partition("/")
                mh = PeerID.from_base58(peer).to_bytes()
                out += _varint(P2P_CODE) + _varint(len(mh)) + mh
                rest = "/" + tail if tail else ""
            if rest:
                out += Multiaddr(rest).to_bytes()
        self.text, self._bytes = text, out

    def to_bytes(self) -> bytes:
        return self._bytes

    def __str__(self) -> str:
        return self.text


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)
