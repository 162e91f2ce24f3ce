"""NAT traversal pieces that need no network: circuit addresses on the wire, relay choice, CLI checks."""

import pytest
import typer
from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from potluck.cli.common import network_config
from potluck.net.config import NetworkConfig
from potluck.net.dial import dial_addresses
from potluck.net.maddrs import WireMaddr
from potluck.net.node import relay_addresses
from potluck.protocol.identity import Identity

RELAY = Identity.generate().peer_id
TARGET = Identity.generate().peer_id


def test_a_circuit_address_is_written_as_go_multiaddr_reads_it():
    text = f"/ip4/10.79.0.1/tcp/4001/p2p/{RELAY}/p2p-circuit"
    wire = WireMaddr(text).to_bytes()
    mh = PeerID.from_base58(RELAY).to_bytes()  # the bare multihash (00 24 08 01 12 20 + key)
    assert mh[:2] == bytes([0x00, 0x24]) and len(mh) == 38
    # ip4 + tcp as hivemind writes them, then p2p (421 = a5 03), its length, the multihash, p2p-circuit.
    expected = (
        Multiaddr("/ip4/10.79.0.1/tcp/4001").to_bytes() + bytes([0xA5, 0x03, len(mh)]) + mh + b"\xa2\x02"
    )
    assert wire == expected
    assert str(WireMaddr(text)) == text
    # hivemind's own codec writes the id as a CIDv1 (01 72 ...), which p2pd refuses: the reason for WireMaddr.
    assert Multiaddr(text).to_bytes() != expected


def test_dial_addresses_strip_the_target_and_keep_circuits_through_the_relay():
    circuit = f"/ip4/10.79.0.1/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{TARGET}"
    direct = f"/ip4/192.168.1.2/tcp/5000/p2p/{TARGET}"
    out = dial_addresses([circuit, direct, circuit], TARGET)
    assert [str(m) for m in out] == [circuit.removesuffix(f"/p2p/{TARGET}"), "/ip4/192.168.1.2/tcp/5000"]
    assert isinstance(out[0], WireMaddr) and not isinstance(out[1], WireMaddr)


def test_relays_default_to_the_bootstrap_peers_that_name_their_id():
    boot = [f"/ip4/10.0.0.1/tcp/1/p2p/{RELAY}", "/ip4/10.0.0.2/tcp/2"]
    assert relay_addresses(NetworkConfig(), boot) == boot[:1]
    own = (f"/ip4/10.0.0.9/tcp/9/p2p/{TARGET}",)
    assert relay_addresses(NetworkConfig(relays=own), boot) == list(own)


def test_the_cli_refuses_an_unknown_reachability_and_a_relay_without_an_id():
    net = network_config(None, None, "/ip4/0.0.0.0/tcp/0", 5.0, reachability="private", relays=None)
    assert net.reachability == "private" and net.relays == ()
    with pytest.raises(typer.Exit):
        network_config(None, None, "/ip4/0.0.0.0/tcp/0", 5.0, reachability="behind")
    with pytest.raises(typer.Exit):
        network_config(
            None, None, "/ip4/0.0.0.0/tcp/0", 5.0, reachability="private", relays=["/ip4/1.2.3.4/tcp/1"]
        )


def test_the_relay_self_test_dials_loopback_when_it_can_else_a_tcp_address():
    from potluck.net.relaycheck import pick_address

    tcp = f"/ip4/10.79.0.1/tcp/4001/p2p/{RELAY}"
    loop = f"/ip4/127.0.0.1/tcp/4001/p2p/{RELAY}"
    quic = f"/ip4/10.79.0.1/udp/4001/quic-v1/p2p/{RELAY}"
    assert pick_address([quic, tcp, loop]) == loop
    assert pick_address([quic, tcp]) == tcp
    assert pick_address([quic, f"{tcp}/p2p-circuit/p2p/{TARGET}"]) is None
