"""The coordinator's swarm memory: the peers to rejoin through, the last plan, and the unfinished swarm of
a job, kept in a small file by the coordinator's key."""

from potluck.cli.launch_cmd import _swarm_id
from potluck.coordinator.memory import (
    MAX_ADDRS,
    MAX_PEERS,
    SwarmMemory,
    bootstrap_addresses,
    load_memory,
    memory_path,
    remember_peers,
    save_memory,
    unfinished_swarm,
    updated,
)
from tests.unit.coordinator.job.test_plan import JOB, ids
from tests.unit.coordinator.job.test_recover import plan


def addr(peer: str, port: int = 4001) -> str:
    return f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}"


def test_only_addresses_naming_their_peer_are_kept_newest_peers_first():
    a, b, me = ids(3)
    memory = remember_peers(SwarmMemory("s", "j"), [(a, [addr(a), "/ip4/1.2.3.4/tcp/1", addr(b)])], 10.0)
    memory = remember_peers(memory, [(b, [addr(b, p) for p in range(10)]), (me, [addr(me)])], 20.0, me)
    assert memory.peers[a] == (addr(a),)
    assert len(memory.peers[b]) == MAX_ADDRS and me not in memory.peers  # never bootstrap from ourselves
    assert bootstrap_addresses(memory)[0] == addr(b, 0)  # b was seen last
    assert bootstrap_addresses(memory)[-1] == addr(a) and bootstrap_addresses(None) == ()


def test_the_peers_seen_last_are_kept():
    peers = ids(MAX_PEERS + 3)
    memory = SwarmMemory("s", "j")
    for t, p in enumerate(peers):
        memory = remember_peers(memory, [(p, [addr(p)])], float(t))
    assert set(memory.peers) == set(peers[3:]) and set(memory.seen) == set(peers[3:])


def test_a_saved_memory_reads_back_and_a_damaged_one_is_ignored(tmp_path):
    (a,) = ids(1)
    path = memory_path(tmp_path / "coordinator.pem", "tiny-3fa2c1")
    assert path == tmp_path / "coordinator.swarms" / "tiny-3fa2c1.json" and load_memory(path) is None
    memory = SwarmMemory("tiny-3fa2c1", "tiny", {a: (addr(a),)}, {a: 5.0}, plan(3), finished=False)
    save_memory(path, memory)
    assert load_memory(path) == memory
    path.write_text('{"swarm_id": "tiny-3fa2c1", "plan": {"epoch": "x"}}')
    assert load_memory(path) is None


def test_updated_says_whether_more_than_last_seen_times_changed():
    (a,) = ids(1)
    first, changed = updated(None, "s", "j", [(a, [addr(a)])], None, False, 1.0)
    assert changed
    again, changed = updated(first, "s", "j", [(a, [addr(a)])], None, False, 2.0)
    assert not changed and again.seen[a] == 2.0
    _, changed = updated(first, "s", "j", [(a, [addr(a)])], plan(1), False, 2.0)
    assert changed
    _, changed = updated(first, "s", "j", [], None, True, 2.0)
    assert changed


def test_a_plain_relaunch_finds_the_jobs_unfinished_swarm(tmp_path):
    key = tmp_path / "coordinator.pem"
    assert unfinished_swarm(key, "tiny") is None
    save_memory(memory_path(key, "tiny-aaaaaa"), SwarmMemory("tiny-aaaaaa", "tiny", finished=True))
    save_memory(memory_path(key, "other-bbbbbb"), SwarmMemory("other-bbbbbb", "other"))
    assert unfinished_swarm(key, "tiny") is None  # finished, or another job's
    save_memory(memory_path(key, "tiny-cccccc"), SwarmMemory("tiny-cccccc", "tiny"))
    assert unfinished_swarm(key, "tiny") == "tiny-cccccc"
    assert unfinished_swarm(tmp_path / "other-key.pem", "tiny") is None  # another key's swarms


def test_launch_without_a_swarm_id_carries_on_with_the_unfinished_swarm(tmp_path):
    key = tmp_path / "coordinator.pem"
    job = JOB.model_copy(update={"name": "tiny"})
    fresh = _swarm_id(job, key, new_swarm=False)
    assert fresh.startswith("tiny-") and fresh != _swarm_id(job, key, new_swarm=False)  # random suffixes
    save_memory(memory_path(key, "tiny-cccccc"), SwarmMemory("tiny-cccccc", "tiny"))
    assert _swarm_id(job, key, new_swarm=False) == "tiny-cccccc"
    assert _swarm_id(job, key, new_swarm=True) != "tiny-cccccc"
