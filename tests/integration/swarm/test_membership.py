"""Swarm membership on a real hivemind DHT with p2pd processes on 127.0.0.1, every process reaped by PID."""

import signal
import time

import msgpack
import pytest

from potluck.protocol.envelope import seal
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite
from potluck.protocol.records import Hardware, PeerRecord
from tests.helpers.swarm import RawNode, local_swarm, potluck_cli, status_json
from tests.unit.protocol.conftest import make_hardware

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TTL = 9.0  # short heartbeat lifetime so expiry is observable quickly


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with local_swarm(tmp_path_factory.mktemp("swarm"), n_peers=3, ttl=TTL) as s:
        yield s


def test_three_peers_appear_in_status_json(swarm):
    deadline = time.monotonic() + 30
    while True:
        doc = status_json(swarm.invite)
        if len(doc["peers"]) == 3 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert doc["swarm_id"] == "itest"
    assert len(doc["peers"]) == 3, doc
    for p in doc["peers"]:
        assert p["peer_id"].startswith("12D3KooW")
        assert p["device_kind"] == "cpu" and p["memory_total_bytes"] > 0 and p["tflops_fp32"] > 0
        assert p["heartbeat_age_s"] < TTL
        assert all(a.startswith("/ip4/127.0.0.1/") for a in p["maddrs"])
    # the potluck peer id is the libp2p id its p2pd announces
    assert all(p["maddrs"][0].endswith(p["peer_id"]) for p in doc["peers"])


def test_links_are_measured_and_published(swarm):
    """Every peer measures the others over real libp2p streams and publishes a signed LinkReport."""
    deadline = time.monotonic() + 90  # a round every links.interval_s; slower on a loaded machine
    while True:
        doc = status_json(swarm.invite)
        ids = {p["peer_id"] for p in doc["peers"]}
        pairs = {(link["src"], link["dst"]) for link in doc["links"]}
        if (len(ids) == 3 and len(pairs) == 6) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert pairs == {(s, d) for s in ids for d in ids if s != d}, doc["links"]
    for link in doc["links"]:
        assert 0 < link["rtt_ms"] < 1000  # loopback, but through two p2pd daemons
        assert link["bandwidth_gbps"] > 0.01


def test_link_probes_are_served_to_members_only(swarm, tmp_path):
    """A stranger that knows the bootstrap address and a peer's addresses reaches the peer, and the peer
    closes its probe stream unserved (a probe costs the peer its upload); members measure each other
    as before (test_links_are_measured_and_published)."""
    import asyncio

    from hivemind.p2p import P2P

    from potluck.net.config import LinkProbeConfig
    from potluck.net.links import LinkProber
    from potluck.net.node import p2pd_dies_with_this_process
    from potluck.protocol.errors import WireError
    from potluck.testbed.localswarm import LOOPBACK

    victim = swarm.wait_for(lambda ps: len(ps) >= 3, timeout_s=30)[0]

    async def probe_as_stranger() -> str:
        key = Identity.generate().write_libp2p_key(tmp_path / "stranger.p2pkey")
        with p2pd_dies_with_this_process():
            p2p = await P2P.create(
                initial_peers=list(swarm.invite.bootstrap),
                host_maddrs=[LOOPBACK],
                nat_port_map=False,
                auto_nat=False,
                identity_path=str(key),
                check_if_identity_free=False,
            )
        try:

            async def addresses(peer: str) -> list[str]:
                return [str(m) for m in victim.record.maddrs]

            prober = LinkProber(p2p, "itest", LinkProbeConfig(bulk_bytes=1 << 20, timeout_s=5), addresses)
            try:
                await prober.measure(victim.peer_id)
            except WireError as e:
                return str(e)
            return "measured"
        finally:
            await p2p.shutdown()

    outcome = asyncio.run(probe_as_stranger())
    assert "closed" in outcome, outcome  # the stream was opened, then closed before the first pong


@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_forged_records_from_a_raw_node_are_never_shown(swarm):
    peers = swarm.wait_for(lambda ps: len(ps) >= 3, timeout_s=30)
    victim = peers[0]
    attacker = Identity.generate()
    fake_hw = Hardware(
        device_kind="cuda",
        device_name="FORGED H100",
        memory_total_bytes=80 << 30,
        memory_free_bytes=80 << 30,
        cpu_cores=64,
        tflops_fp32=60.0,
        tflops_bf16=990.0,
    )
    now = time.time()
    # 1. the attacker signs a record that claims the victim's identity
    impostor = PeerRecord(peer_id=victim.peer_id, hardware=fake_hw, issued_at=now)
    forged_claim = seal(attacker, "itest", "peers", impostor, now + 60, victim.peer_id)
    # 2. a record for a fake peer whose signature is garbage
    ghost = Identity.generate()
    ghost_rec = PeerRecord(peer_id=ghost.peer_id, hardware=fake_hw, issued_at=now)
    fields = msgpack.unpackb(seal(ghost, "itest", "peers", ghost_rec, now + 60, ghost.peer_id))
    fields[6] = bytes(64)
    forged_sig = msgpack.packb(fields, use_bin_type=True)
    raw = RawNode(swarm.invite)
    try:
        # the raw node keeps its own copy (no validator), honest nodes refuse theirs
        raw.store("peers", victim.peer_id, forged_claim)
        raw.store("peers", ghost.peer_id, forged_sig)
        for _ in range(3):  # several reads while the raw node is up: lookups may reach it
            doc = status_json(swarm.invite)
            ids = {p["peer_id"] for p in doc["peers"]}
            assert ghost.peer_id not in ids
            assert all(p["device_name"] != "FORGED H100" for p in doc["peers"]), doc
            assert victim.peer_id in ids
    finally:
        raw.close()


@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_unadmitted_and_replayed_admission_records_are_never_shown(swarm):
    peers = swarm.wait_for(lambda ps: len(ps) >= 3, timeout_s=30)
    now = time.time()
    stranger, thief = Identity.generate(), Identity.generate()
    hw = make_hardware(device_name="STRANGER")
    raw = RawNode(swarm.invite)
    try:
        # 1. a validly signed record, bootstrap address and swarm id known, but never admitted
        rec = PeerRecord(peer_id=stranger.peer_id, hardware=hw, issued_at=now)
        raw.store(
            "peers", stranger.peer_id, seal(stranger, "itest", "peers", rec, now + 60, stranger.peer_id)
        )
        # 2. a peer's admission read from the DHT and attached to the thief's own record
        victim_env = msgpack.unpackb(raw.fetch("peers")[peers[0].peer_id])
        assert len(victim_env) == 8 and victim_env[7], "honest records carry their admission"
        rec = PeerRecord(peer_id=thief.peer_id, hardware=hw, issued_at=now)
        stolen = seal(thief, "itest", "peers", rec, now + 60, thief.peer_id, victim_env[7])
        raw.store("peers", thief.peer_id, stolen)
        for _ in range(3):
            ids = {p["peer_id"] for p in status_json(swarm.invite)["peers"]}
            assert not {stranger.peer_id, thief.peer_id} & ids
            assert {p.peer_id for p in peers} <= ids
    finally:
        raw.close()


@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_a_peer_without_a_valid_token_is_refused_with_the_reason(swarm, tmp_path):
    untokened = Invite(swarm.invite.swarm_id, swarm.invite.bootstrap, swarm.invite.coordinator_key)
    for name, invite, why in [
        ("no-token", untokened, "no valid join token"),
        (
            "made-up",
            Invite(untokened.swarm_id, untokened.bootstrap, untokened.coordinator_key, "pltok1.x"),
            "",
        ),
    ]:
        out = potluck_cli(
            "peer",
            "--join",
            invite.encode(),
            "--state-dir",
            str(tmp_path / name),
            "--host-maddrs",
            "/ip4/127.0.0.1/tcp/0",
            "--probe-seconds",
            "0",
            timeout=60,
        )
        assert out.returncode == 2, out.stdout + out.stderr
        assert "error:" in out.stderr and why in out.stderr, out.stderr


def test_sigterm_peer_leaves_within_5s(swarm):
    swarm.wait_for(lambda ps: len(ps) >= 3, timeout_s=30)
    pid_before = {p.peer_id for p in swarm.live_peers()}
    start = time.monotonic()
    exit_s = swarm.stop("peer1", signal.SIGTERM)
    assert exit_s < 5.0, f"peer took {exit_s:.1f} s to exit"
    assert swarm.procs["peer1"].popen.returncode == 0, swarm.procs["peer1"].tail()
    peers = swarm.wait_for(
        lambda ps: len(ps) == 2, timeout_s=5.0 - (time.monotonic() - start) + 1.0, poll_s=0.3
    )
    gone_s = time.monotonic() - start
    assert gone_s < 6.0  # 5 s bound plus one status read
    assert len(pid_before - {p.peer_id for p in peers}) == 1


def test_sigkill_peer_disappears_after_ttl(swarm):
    before = swarm.wait_for(lambda ps: len(ps) >= 2, timeout_s=30)
    start = time.monotonic()
    swarm.stop("peer2", signal.SIGKILL)
    # a crashed peer cannot withdraw: right after the kill it is still listed...
    assert len(swarm.live_peers()) == len(before)
    # ...and its heartbeat lapses within one TTL
    after = swarm.wait_for(lambda ps: len(ps) == len(before) - 1, timeout_s=TTL + 10, poll_s=0.5)
    elapsed = time.monotonic() - start
    assert elapsed <= TTL + 10
    assert len(after) == len(before) - 1


@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_unreachable_bootstrap_fails_with_advice(tmp_path):
    dead = f"/ip4/127.0.0.1/tcp/9/p2p/{Identity.generate().peer_id}"
    invite = Invite("itest", (dead,), Identity.generate().public_key)
    start = time.monotonic()
    result = potluck_cli(
        "peer",
        "--join",
        invite.encode(),
        "--identity",
        str(tmp_path / "id.pem"),
        "--host-maddrs",
        "/ip4/127.0.0.1/tcp/0",
        "--bootstrap-timeout",
        "3",
        "--probe-seconds",
        "0",
    )
    assert result.returncode == 2, result.stderr
    assert dead in result.stderr and "--announce-maddrs" in result.stderr
    assert time.monotonic() - start < 30


def test_a_banned_peer_is_dropped_within_a_heartbeat_and_leaves(swarm):
    # the last test of the module: peer0 is the one left (peer1 left, peer2 was killed)
    peers = swarm.wait_for(lambda ps: len(ps) >= 1, timeout_s=30)
    victim = peers[0].peer_id
    key = swarm.root / "coordinator.pem"
    out = potluck_cli("ban", victim, "--join", swarm.invite.encode(), "--identity", str(key), timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    start = time.monotonic()
    swarm.wait_for(lambda ps: victim not in {p.peer_id for p in ps}, timeout_s=2 * TTL)
    assert time.monotonic() - start < 2 * TTL
    swarm.procs["peer0"].popen.wait(timeout=30)  # it read the list, saw itself on it and left
    assert "banned" in swarm.procs["peer0"].tail(40)
