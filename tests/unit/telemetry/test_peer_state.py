""" "Is my node contributing?": the peer's state from what its daemon and worker know, and the snapshot
its status line, /metrics and MQTT messages are built from."""

import time
from types import SimpleNamespace

from potluck.cli.peer_cmd import status_line
from potluck.peer.activity import Activity
from potluck.peer.telemetry import STALE_AFTER_S, PeerTelemetry, peer_metrics
from potluck.protocol.identity import Identity
from potluck.protocol.records import Hardware
from potluck.telemetry.config import TelemetryConfig

HW = Hardware(
    device_kind="cpu", device_name="test cpu", memory_total_bytes=1 << 30, memory_free_bytes=1 << 29,
    cpu_cores=2, tflops_fp32=0.1, tflops_bf16=0.05,
)  # fmt: skip


def telemetry(flags: dict, activity: Activity | None):
    worker = (
        None
        if activity is None
        else SimpleNamespace(activity=activity, last_report=None, tokens_per_s=0.0, box=None)
    )
    return PeerTelemetry(
        Identity.generate(), "state-test", TelemetryConfig(), hardware=lambda: HW, worker=lambda: worker,
        links=lambda: {}, leaving=lambda: flags["leaving"], alone=lambda: flags["alone"],
    )  # fmt: skip


def test_the_state_follows_the_peers_life():
    flags = {"leaving": False, "alone": False}
    act = Activity()
    t = telemetry(flags, act)
    now = time.monotonic()
    assert t.state(now) == "joining"
    act.spared("job", 1, "spare: the plan is faster without it")
    assert t.state(now) == "spare"
    act.placed("job", 2, 1, 0, 40, "2-3")
    assert t.state(now) == "syncing"
    act.committed(40, 64, 1e9)
    assert t.state(time.monotonic()) == "contributing"
    assert t.state(time.monotonic() + STALE_AFTER_S + 1) == "stale"  # placed, but steps stopped
    act.failed(41, "no READY from 12D3KooWx")
    assert t.state(time.monotonic()) == "stale" and "step 41" in act.last_abort
    flags["alone"] = True
    assert t.state(now) == "unreachable"
    flags["leaving"] = True
    assert t.state(now) == "leaving"


def test_the_snapshot_feeds_the_status_line_and_metrics():
    act = Activity()
    events = []
    act.on_event = lambda kind, detail, data: events.append(kind)
    t = telemetry({"leaving": False, "alone": False}, act)
    act.placed("job", 2, 1, 0, 40, "2-3")
    act.took_state("peers:abc", 0.5, 2_000_000, 40)
    act.committed(40, 64, 6.0e12)
    snap = t.snapshot()
    assert snap.status.state == "contributing" and snap.status.stage == 1 and snap.status.step == 41
    assert snap.metrics.tokens_contributed == 64 and snap.metrics.memory_bytes > 0
    line = status_line(snap)
    assert "[contributing]" in line and "stage 1, replica 0 of plan epoch 2" in line and "64 tokens" in line
    assert b"potluck_peer_contributed_tokens_total 64.0" in peer_metrics(snap)
    assert events == ["placed", "state_received"]


def test_a_status_line_quoting_an_address_prints_as_it_is():
    """A peer died when rich read the "[/ip4/...]" of a dial error in its last-aborted message as a
    closing markup tag; the line now prints with markup off, its "[state]" included."""
    import io

    from rich.console import Console

    from potluck.cli.peer_cmd import print_status

    act = Activity()
    t = telemetry({"leaving": False, "alone": False}, act)
    act.placed("job", 2, 1, 0, 40, "2-3")
    act.failed(41, "cannot open a stream to X:   * [/ip4/127.0.0.1/tcp/37019] dial backoff")
    out = io.StringIO()
    print_status(Console(file=out, width=400), t.snapshot())
    assert "[/ip4/127.0.0.1/tcp/37019]" in out.getvalue()
    assert out.getvalue().startswith("[")  # the state, not eaten as a markup tag
