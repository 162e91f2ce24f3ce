"""The one message-tag layout: packing, ordering, ranges, and forgetting finished rounds by span."""

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.net.tags import (
    ATTEMPT_BITS,
    ATTEMPTS,
    BUCKET_PHASES,
    EPOCH_BITS,
    INDEX_BITS,
    PHASE_BITS,
    STEP_BITS,
    TAG_BYTES,
    Direction,
    Phase,
    Round,
    RoundSpan,
    Stream,
    Tag,
    before,
    make_tag,
)
from potluck.protocol.errors import WireError

rounds = st.builds(
    Round,
    st.integers(0, (1 << EPOCH_BITS) - 1),
    st.integers(0, (1 << STEP_BITS) - 1),
    st.integers(0, (1 << PHASE_BITS) - 1),
    st.integers(0, (1 << ATTEMPT_BITS) - 1),
)


def test_the_round_fields_fill_exactly_64_bits():
    assert EPOCH_BITS + STEP_BITS + PHASE_BITS + ATTEMPT_BITS == 64
    assert 1 << STEP_BITS > 10**9  # JobSpec.steps and every step a plan can start from
    assert Round((1 << EPOCH_BITS) - 1, (1 << STEP_BITS) - 1, 15, ATTEMPTS - 1).pack() == (1 << 64) - 1


@given(rounds)
def test_pack_unpack_round_trip(r):
    assert 0 <= r.pack() < 1 << 64
    assert Round.unpack(r.pack()) == r


@given(
    rounds, st.integers(0, (1 << INDEX_BITS) - 1), st.integers(0, (1 << 32) - 1), st.sampled_from(Direction)
)
def test_tag_wire_round_trip(r, index, chunk, direction):
    tag = make_tag(r, Stream.TREE, index=index, chunk=chunk, direction=direction)
    data = tag.pack()
    assert len(data) == TAG_BYTES == 17
    assert Tag.unpack(data + b"payload") == tag
    assert Round.unpack(tag.round) == r
    assert str(tag).startswith(f"<{r} tree[{index}]")


@given(rounds, rounds)
def test_distinct_rounds_pack_distinctly_and_in_tuple_order(a, b):
    assert (a == b) == (a.pack() == b.pack())
    assert (a < b) == (a.pack() < b.pack())
    key = (a.epoch, a.step, a.phase, a.attempt) < (b.epoch, b.step, b.phase, b.attempt)
    assert key == (a.pack() < b.pack())


def test_phases_and_attempts_stay_inside_their_step():
    r = Round(3, 41)
    last = r.bucket(BUCKET_PHASES - 1).retry(ATTEMPTS - 1)
    assert r.pack() < r.at(Phase.OUTER).pack() < r.bucket(0).pack() < last.pack() < Round(3, 42).pack()
    assert r.bucket(0).phase == Phase.BUCKETS
    assert len({r.bucket(b) for b in range(BUCKET_PHASES)} | {r, r.at(Phase.OUTER)}) == BUCKET_PHASES + 2


def test_every_stream_is_distinct():
    r = Round(1, 2)
    streams = {make_tag(r, s).stream for s in Stream}
    assert len(streams) == len(Stream)
    # indices never reach into the kind bits: tree 0 of TREE is not any other stream's tag
    indexed = {make_tag(r, s, index=i).stream for s in Stream for i in (0, 1, (1 << INDEX_BITS) - 1)}
    assert len(indexed) == 3 * len(Stream)


@pytest.mark.parametrize(
    "build",
    [
        lambda: Round(1 << EPOCH_BITS, 0),
        lambda: Round(0, 1 << STEP_BITS),
        lambda: Round(0, 0, 1 << PHASE_BITS),
        lambda: Round(0, 0, 0, ATTEMPTS),
        lambda: Round(-1, 0),
        lambda: Round(0, 5).bucket(BUCKET_PHASES),
        lambda: Round(0, 5).retry(ATTEMPTS),
        lambda: Round.unpack(1 << 64),
        lambda: make_tag(Round(0, 0), Stream.TREE, index=1 << INDEX_BITS),
        lambda: make_tag(Round(0, 0), Stream.RING, chunk=1 << 32),
        lambda: Tag(0, 1 << 32),
    ],
)
def test_out_of_range_fields_raise_instead_of_aliasing(build):
    with pytest.raises(WireError, match=r"does not fit|no tag phase"):
        build()


def test_spans():
    r = Round(2, 7, Phase.BUCKETS + 3)
    tries = r.attempts()
    assert all(r.retry(a).pack() in tries for a in range(ATTEMPTS))
    assert r.at(Phase.BUCKETS + 2).retry(ATTEMPTS - 1).pack() not in tries
    assert r.at(Phase.BUCKETS + 4).pack() not in tries
    assert Round(2, 8).pack() not in tries
    done = before(2, 8)
    assert Round(1, 10**9).pack() in done and Round(2, 7).bucket(13).retry(7).pack() in done
    assert Round(2, 8).pack() not in done and Round(3, 0).pack() not in done
    assert "7" not in RoundSpan(0, 10)


class _FakeP2P:
    """Just enough of hivemind's P2P for a mailbox that only talks to itself (no streams)."""

    peer_id = SimpleNamespace(to_base58=lambda: "me")


def test_forgetting_a_round_keeps_later_rounds():
    async def main():
        box = Mailbox(_FakeP2P(), "potluck/test/tags/1", TransportConfig(timeout_s=1.0))  # type: ignore[arg-type]
        step = Round(4, 10)
        bucket3, bucket4 = step.bucket(3), step.bucket(4)
        later = [bucket4, step.bucket(5), Round(4, 11), Round(5, 0)]
        for r in [step, bucket3, bucket3.retry(2), *later]:
            await box.send("me", make_tag(r, Stream.TREE, chunk=1), r.pack().to_bytes(8, "little"))
        # a relaxed round of bucket 3 ends: its attempts go, bucket 4 (still running) and later steps stay
        assert await box.forget(bucket3.attempts()) == 2
        for r in later:
            assert await box.recv("me", make_tag(r, Stream.TREE, chunk=1), 0.1) == r.pack().to_bytes(
                8, "little"
            )
        with pytest.raises(WireError, match="no message"):
            await box.recv("me", make_tag(bucket3, Stream.TREE, chunk=1), 0.05)
        # step 10 ends: everything before step 11 goes, step 11's early arrival stays
        early = make_tag(Round(4, 11), Stream.ACTIVATIONS)
        await box.send("me", early, b"early")
        assert await box.forget(before(4, 11)) == 1  # the step's own pipeline message
        assert await box.recv("me", early, 0.1) == b"early"
        assert box._pending_bytes == 0

    asyncio.run(main())
