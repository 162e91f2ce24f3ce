"""Telemetry messages: signed by their sender, checked before use; forged, malformed, oversized or foreign
messages are refused with a reason."""

import json

import pytest

from potluck.protocol.errors import RecordError
from potluck.protocol.identity import Identity
from potluck.protocol.telemetry import (
    VERSION,
    CoordinatorStatus,
    Event,
    PeerMetrics,
    PeerStatus,
    coordinator_topic,
    open_message,
    peer_topic,
    seal_message,
)

PEER, OTHER, COORD = Identity.generate(), Identity.generate(), Identity.generate()
SWARM = "tel-test"


def status(who: Identity = PEER, **kw) -> PeerStatus:
    return PeerStatus(v=VERSION, peer=who.peer_id, at=1000.0, state="contributing", step=7, **kw)


def test_a_sealed_message_opens_on_its_own_topic_only():
    payload = seal_message(PEER, status(stage=1, replica=0))
    got = open_message(peer_topic(SWARM, PEER.peer_id, "status"), payload, SWARM)
    assert isinstance(got, PeerStatus) and got.step == 7 and got.stage == 1
    with pytest.raises(RecordError, match="names peer"):  # replayed under another peer's topic
        open_message(peer_topic(SWARM, OTHER.peer_id, "status"), payload, SWARM)
    with pytest.raises(RecordError, match="not of swarm"):
        open_message(peer_topic("elsewhere", PEER.peer_id, "status"), payload, SWARM)
    with pytest.raises(RecordError, match="field kind"):  # a status payload is no event
        open_message(peer_topic(SWARM, PEER.peer_id, "events"), payload, SWARM)


def test_forged_and_unsigned_messages_are_refused():
    topic = peer_topic(SWARM, PEER.peer_id, "status")
    obj = json.loads(seal_message(PEER, status()))
    obj["step"] = 10_000  # changed after signing
    with pytest.raises(RecordError, match="signature"):
        open_message(topic, json.dumps(obj).encode(), SWARM)
    del obj["sig"]
    with pytest.raises(RecordError, match="signature"):
        open_message(topic, json.dumps(obj).encode(), SWARM)
    forged = json.loads(seal_message(OTHER, status(OTHER)))
    forged["peer"] = PEER.peer_id  # OTHER's signature over a message claiming to be PEER's
    with pytest.raises(RecordError, match="signature"):
        open_message(topic, json.dumps(forged).encode(), SWARM)
    with pytest.raises(RecordError):
        seal_message(OTHER, status(PEER))  # nobody signs a message naming another peer


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"{" + b" " * 70_000 + b"}", "byte limit"),
        (b'{"peer": "x"}', "names peer"),
    ],
)
def test_malformed_payloads_are_refused_with_a_reason(payload, why):
    with pytest.raises(RecordError, match=why):
        open_message(peer_topic(SWARM, PEER.peer_id, "metrics"), payload, SWARM)


def test_values_out_of_range_fail_the_schema_after_the_signature():
    bad = status().model_copy(update={"step": -5})  # model_copy does not validate: a hostile sender could
    with pytest.raises(RecordError, match="field step"):
        open_message(peer_topic(SWARM, PEER.peer_id, "status"), seal_message(PEER, bad), SWARM)


def test_unknown_fields_are_ignored_so_newer_senders_stay_readable():
    obj = status().model_dump(mode="json") | {"gpu_temperature_c": 71}
    import base64

    from potluck.protocol.telemetry import canonical

    obj["sig"] = base64.b64encode(PEER.sign(canonical(obj))).decode()
    got = open_message(peer_topic(SWARM, PEER.peer_id, "status"), json.dumps(obj).encode(), SWARM)
    assert got.step == 7


def test_coordinator_messages_need_the_invites_key():
    st = CoordinatorStatus(v=VERSION, peer=COORD.peer_id, at=1.0, job="j", state="training", steps=10)
    payload = seal_message(COORD, st)
    topic = coordinator_topic(SWARM, "status")
    assert open_message(topic, payload, SWARM, COORD.public_key).job == "j"
    with pytest.raises(RecordError, match="without the coordinator's key"):
        open_message(topic, payload, SWARM)
    impostor = seal_message(OTHER, st.model_copy(update={"peer": OTHER.peer_id}))
    with pytest.raises(RecordError):
        open_message(topic, impostor, SWARM, COORD.public_key)


def test_metrics_and_events_round_trip():
    m = PeerMetrics(
        v=VERSION, peer=PEER.peer_id, at=2.0, state="contributing", step=3, loss=2.5, tokens_per_s=100.0,
        links={OTHER.peer_id: {"mb_s": 12.5, "rtt_ms": 3.0}}, codec_ratio={"activations": 4.0},
        tokens_contributed=640, flops_contributed=1e9,
    )  # fmt: skip
    got = open_message(peer_topic(SWARM, PEER.peer_id, "metrics"), seal_message(PEER, m), SWARM)
    assert got == m
    e = Event(v=VERSION, peer=PEER.peer_id, at=3.0, kind="step_aborted", detail="no READY", data={"step": 4})
    assert open_message(peer_topic(SWARM, PEER.peer_id, "events"), seal_message(PEER, e), SWARM) == e
    with pytest.raises(ValueError):
        Event(v=VERSION, peer=PEER.peer_id, at=3.0, kind="party", detail="")
