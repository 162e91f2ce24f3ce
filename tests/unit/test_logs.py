"""potluck.logs: the level from flags and POTLUCK_LOGLEVEL, ids on every record, JSON lines."""

import asyncio
import io
import json
import logging

import pytest

from potluck import logs

PEER = "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"


@pytest.fixture
def root():
    """Leave the root and hivemind loggers as they were, whatever configure() did."""
    root, lib = logging.getLogger(), logging.getLogger("hivemind")
    saved = (list(root.handlers), root.level, list(lib.handlers), lib.level, lib.propagate)
    yield root
    root.handlers[:], root.level = saved[0], saved[1]
    lib.handlers[:], lib.level, lib.propagate = saved[2], saved[3], saved[4]
    logs._handler = None


@pytest.mark.parametrize(
    ("env", "verbose", "level"),
    [
        (None, 0, logging.WARNING),
        ("info", 0, logging.INFO),
        ("DEBUG", 0, logging.DEBUG),
        ("ERROR", 1, logging.INFO),  # -v still means info
        (None, 2, logging.DEBUG),
        ("LOUD", 0, logging.WARNING),  # not a level: the default, with a warning
    ],
)
def test_level_from_flags_then_env_then_default(monkeypatch, root, env, verbose, level):
    if env is None:
        monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    else:
        monkeypatch.setenv(logs.LEVEL_ENV, env)
    monkeypatch.setenv("HIVEMIND_LOGLEVEL", "INFO")
    out = io.StringIO()
    logs.configure(verbose, stream=out)
    assert root.level == level
    assert logging.getLogger("hivemind").getEffectiveLevel() == level  # hivemind follows
    assert ("is not a level" in out.getvalue()) == (env == "LOUD")


def test_text_records_carry_the_bound_ids(monkeypatch, root):
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    out = io.StringIO()
    logs.configure(1, stream=out)  # -v: info records show
    log = logging.getLogger("potluck.test")

    async def peer() -> None:
        logs.bind(peer_id=PEER, swarm_id="demo")
        log.info("joined")

    log.info("before")
    asyncio.run(peer())
    before, joined = out.getvalue().splitlines()
    assert before.endswith("potluck.test: before")  # nothing bound: the old format exactly
    assert joined.endswith(f"potluck.test [demo …{PEER[-8:]}]: joined")


def test_json_lines_with_ids_and_traceback(monkeypatch, root):
    monkeypatch.setenv(logs.FORMAT_ENV, "json")
    out = io.StringIO()
    logs.configure(stream=out)
    log = logging.getLogger("potluck.test")

    async def peer(peer_id: str) -> None:
        logs.bind(peer_id=peer_id, swarm_id="s1")
        await asyncio.sleep(0)
        try:
            raise KeyError("lost-layer")
        except KeyError:
            log.exception("step failed")

    async def two_peers() -> None:  # one process, two peers: each record keeps its own peer's id
        await asyncio.gather(peer(PEER), peer("12D3KooWother"))

    asyncio.run(two_peers())
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {d["peer_id"] for d in docs} == {PEER, "12D3KooWother"}
    for doc in docs:
        assert doc["swarm_id"] == "s1" and doc["level"] == "ERROR" and doc["logger"] == "potluck.test"
        assert doc["msg"] == "step failed" and "KeyError: 'lost-layer'" in doc["exc"]
        assert isinstance(doc["ts"], float)


def test_configure_twice_keeps_one_handler(root):
    before = len(root.handlers)
    logs.configure(stream=io.StringIO())
    logs.configure(stream=io.StringIO())
    assert len(root.handlers) == before + 1


def test_adopt_routes_a_library_through_our_handler(root):
    lib = logging.getLogger("hivemind")
    own = logging.StreamHandler(io.StringIO())
    lib.addHandler(own)
    lib.propagate = False
    out = io.StringIO()
    logs.configure(
        1, stream=out
    )  # -v (info); adopts hivemind if it is imported already, or when a node starts
    lib.addHandler(own)  # as hivemind does when it is imported after configure()
    lib.propagate = False
    logs.adopt("hivemind")
    logging.getLogger("hivemind.dht").info("hello from the DHT")
    assert own not in lib.handlers and lib.propagate
    assert "hivemind.dht: hello from the DHT" in out.getvalue()
