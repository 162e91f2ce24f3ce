"""The swarm view the dashboard, /metrics and `potluck monitor` read: only members are shown once the
coordinator vouches for them, silence turns into "stale", the last will into "offline"; the Prometheus
text parses and carries the numbers."""

from prometheus_client.parser import text_string_to_metric_families

from potluck.protocol.identity import Identity
from potluck.protocol.telemetry import (
    VERSION,
    CoordinatorStatus,
    Event,
    MemberView,
    PeerMetrics,
    PeerStatus,
    StageView,
    coordinator_topic,
    peer_topic,
    seal_message,
)
from potluck.telemetry.aggregate import SILENT_S, SwarmView
from potluck.telemetry.prometheus import peer_metrics_text, swarm_metrics_text

SWARM = "agg-test"
COORD = Identity.generate()
A, B, STRANGER = Identity.generate(), Identity.generate(), Identity.generate()


def send(view: SwarmView, who: Identity, kind: str, message, now: float) -> bool:
    return view.ingest(peer_topic(SWARM, who.peer_id, kind), seal_message(who, message), now)


def status(who: Identity, at: float, state: str = "contributing", **kw) -> PeerStatus:
    return PeerStatus(v=VERSION, peer=who.peer_id, at=at, state=state, **kw)


def metrics(who: Identity, at: float, **kw) -> PeerMetrics:
    return PeerMetrics(v=VERSION, peer=who.peer_id, at=at, state="contributing", **kw)


def coordinator(at: float, members: list[Identity], step: int = 5) -> CoordinatorStatus:
    return CoordinatorStatus(
        v=VERSION, peer=COORD.peer_id, at=at, job="j", state="training", steps=100, step=step, loss=2.0,
        tokens_per_s=50.0, epoch=3, stages=[StageView(first_layer=0, last_layer=2, peers=[A.peer_id])],
        members={m.peer_id: MemberView(device="cpu: test", tflops=0.1) for m in members},
    )  # fmt: skip


def test_only_members_are_shown_once_the_coordinator_vouches():
    view = SwarmView(SWARM, COORD.public_key)
    assert send(view, STRANGER, "status", status(STRANGER, 1.0), 1.0)  # nobody vouched yet: shown
    topic = coordinator_topic(SWARM, "status")
    assert view.ingest(topic, seal_message(COORD, coordinator(2.0, [A, B])), 2.0)
    assert STRANGER.peer_id not in view.peers  # forgotten once the members are known
    assert not send(view, STRANGER, "status", status(STRANGER, 3.0), 3.0)
    assert view.rejected == 1 and "not a member" in view.last_rejection
    assert send(view, A, "status", status(A, 3.0, stage=0, replica=0, step=5), 3.0)
    snap = view.snapshot(3.0)
    assert [p["id"] for p in snap["peers"]] == [A.peer_id]
    assert snap["plan"]["stages"][0]["replicas"][0]["state"] == "contributing"
    assert snap["job"]["step"] == 5 and snap["series"]["loss"] == [2.0]


def test_a_forged_coordinator_status_cannot_vouch_for_anyone():
    view = SwarmView(SWARM, COORD.public_key)
    fake = coordinator(2.0, [STRANGER]).model_copy(update={"peer": STRANGER.peer_id})
    assert not view.ingest(coordinator_topic(SWARM, "status"), seal_message(STRANGER, fake), 2.0)
    assert view.coordinator is None


def test_silence_is_stale_and_the_last_will_is_offline():
    view = SwarmView(SWARM, COORD.public_key)
    send(view, A, "status", status(A, 10.0), 10.0)
    assert view.peer_state(A.peer_id, 10.0 + SILENT_S - 1) == "contributing"
    assert view.peer_state(A.peer_id, 10.0 + SILENT_S + 1) == "stale"
    send(view, A, "status", status(A, 11.0, "offline"), 11.0)
    assert view.peer_state(A.peer_id, 500.0) == "offline"
    send(view, A, "status", status(A, 9.0), 12.0)  # an older retained copy arriving late changes nothing
    assert view.peer_state(A.peer_id, 12.0) == "offline"


def test_events_are_kept_once_newest_first():
    view = SwarmView(SWARM, COORD.public_key)
    e = Event(v=VERSION, peer=A.peer_id, at=5.0, kind="step_aborted", detail="no READY from x")
    send(view, A, "events", e, 5.0)
    send(view, A, "events", e, 5.5)  # heard twice (the coordinator hears its own events back)
    later = Event(v=VERSION, peer=A.peer_id, at=6.0, kind="placed", detail="stage 0")
    send(view, A, "events", later, 6.0)
    assert [x["kind"] for x in view.snapshot(7.0)["events"]] == ["placed", "step_aborted"]


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_prometheus_text_parses_and_carries_the_numbers():
    st = status(A, 1.0, step=9)
    m = metrics(
        A, 1.0, step=9, loss=1.5, tokens_per_s=200.0, bytes_sent=1234, tokens_contributed=640,
        timing={"compute": 0.2, "send": 0.1, "recv": 0.0, "allreduce": 0.05, "idle": 0.0, "total": 0.35},
        links={B.peer_id: {"mb_s": 10.0, "rtt_ms": 4.0}}, codec_ratio={"gradients": 4.0},
    )  # fmt: skip
    got = _samples(peer_metrics_text(st, m))
    assert got[("potluck_peer_state", (("state", "contributing"),))] == 1.0
    assert got[("potluck_peer_state", (("state", "offline"),))] == 0.0
    assert got[("potluck_peer_loss", ())] == 1.5
    assert got[("potluck_peer_sent_bytes_total", ())] == 1234
    assert got[("potluck_peer_contributed_tokens_total", ())] == 640
    assert got[("potluck_peer_step_seconds", (("part", "compute"),))] == 0.2
    assert got[("potluck_peer_link_rtt_seconds", (("dst", B.peer_id),))] == 0.004
    view = SwarmView(SWARM, COORD.public_key)
    view.ingest(coordinator_topic(SWARM, "status"), seal_message(COORD, coordinator(1.0, [A])), 1.0)
    send(view, A, "status", st, 1.0)
    send(view, A, "metrics", m, 1.0)
    swarm = _samples(swarm_metrics_text(view, 2.0))
    assert swarm[("potluck_job_step", (("job", "j"),))] == 5
    assert swarm[("potluck_swarm_peers", (("state", "contributing"),))] == 1
    assert swarm[("potluck_peer_loss", (("peer", A.peer_id),))] == 1.5
    assert swarm[("potluck_telemetry_messages_total", ())] == 3
