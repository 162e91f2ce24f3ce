"""The leader's round (``peer/collectives/rounds.py``), on a fake mailbox whose replies come after set
delays: bounded waits, an early stop, failures tolerated and counted, late waits cancelled."""

import asyncio
import logging

import pytest

from potluck.net.tags import Tag
from potluck.peer.collectives.rounds import announce, collect, raw
from potluck.protocol.errors import WireError

TAG = Tag(1, 0, 0)


class Box:
    """replies: peer -> (seconds until it comes, payload or None for a stream that fails at once)."""

    def __init__(self, replies: dict[str, tuple[float, bytes | None]], unreachable: set[str] = frozenset()):
        self.replies, self.unreachable = replies, unreachable
        self.cancelled: list[str] = []
        self.sent: dict[str, bytes] = {}

    async def recv(self, peer: str, tag: Tag, timeout_s: float) -> bytes:
        delay, payload = self.replies.get(peer, (float("inf"), b""))
        try:
            if delay > timeout_s:
                await asyncio.sleep(timeout_s)
                raise WireError(f"no message from {peer} within {timeout_s} s")
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self.cancelled.append(peer)
            raise
        if payload is None:
            raise WireError(f"stream from {peer} failed")
        return payload

    async def send_quietly(self, peer: str, tag: Tag, payload: bytes) -> str | None:
        if peer in self.unreachable:
            return f"cannot reach {peer}"
        self.sent[peer] = payload
        return None


def run(coro):
    return asyncio.run(coro)


def test_every_reply_in_time_and_the_late_and_broken_ones_as_failures():
    box = Box({"a": (0.01, b"1"), "b": (0.02, b"2"), "c": (5.0, b"late"), "d": (0.0, None)})
    got = run(collect(box, ["a", "b", "c", "d"], TAG, 0.2, raw))  # type: ignore[arg-type]
    assert got.got == {"a": b"1", "b": b"2"} and set(got.failed) == {"c", "d"} and got.pending == []
    assert "within 0.2 s" in got.failed["c"] and "failed" in got.failed["d"]


def test_the_rule_stops_the_round_and_cancels_the_waits_left():
    box = Box({"a": (0.01, b"ok"), "b": (0.02, b"no"), "c": (2.0, b"ok")})
    got = run(collect(box, ["a", "b", "c"], TAG, 5.0, raw, lambda r: b"no" in r.got.values()))  # type: ignore[arg-type]
    assert got.got == {"a": b"ok", "b": b"no"} and got.pending == ["c"] and box.cancelled == ["c"]


def test_a_refused_reply_counts_as_a_failure_and_other_errors_are_the_callers():
    def parse(peer: str, data: bytes) -> int:
        if data == b"bad":
            raise WireError(f"{peer} sent garbage")
        if data == b"bug":
            raise ValueError("a bug")
        return int(data)

    box = Box({"a": (0.0, b"7"), "b": (0.0, b"bad")})
    got = run(collect(box, ["a", "b"], TAG, 1.0, parse))  # type: ignore[arg-type]
    assert got.got == {"a": 7} and got.failed == {"b": "b sent garbage"}
    with pytest.raises(ValueError, match="a bug"):
        run(collect(Box({"a": (0.0, b"bug")}), ["a"], TAG, 1.0, parse))  # type: ignore[arg-type]


def test_no_peers_is_an_empty_round():
    got = run(collect(Box({}), [], TAG, 1.0, raw))  # type: ignore[arg-type]
    assert (got.got, got.failed, got.pending) == ({}, {}, [])


def test_an_announcement_reaches_whom_it_can_and_names_the_rest(caplog):
    box = Box({}, unreachable={"b"})
    with caplog.at_level(logging.INFO):
        missed = run(announce(box, ["a", "b", "c"], TAG, b"go", "the answer"))  # type: ignore[arg-type]
    assert missed == ["b"] and box.sent == {"a": b"go", "c": b"go"}
    assert "the answer not delivered to b: cannot reach b" in caplog.text
