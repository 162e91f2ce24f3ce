"""``potluck peer --share-device``: the co-tenant's command line and state directory (cli/cotenant.py)."""

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from potluck.cli.cotenant import cotenant_argv, prepare, reap
from potluck.cli.peer_cmd import _pass_on


def test_the_cotenant_runs_the_volunteers_command_with_its_own_key_ports_and_checkpoints(tmp_path):
    argv = [
        "-v",
        "peer",
        "--join",
        "@invite.txt",
        "--state-dir",
        str(tmp_path),
        "--identity=/keys/me.pem",
        "--share-device",
        "--host-maddrs",
        "/ip4/127.0.0.1/tcp/4001",
        "--metrics-port",
        "9100",
        "--checkpoint-dir",
        "/ckpt/mine",
        "--threads",
        "1",
    ]
    out = cotenant_argv(argv, tmp_path, "12D3KooWHost", Path("/ckpt/mine"))
    assert out[:2] == ["-v", "peer"]
    for gone in (
        "--share-device",
        "--identity=/keys/me.pem",
        "--metrics-port",
        "9100",
        "/ip4/127.0.0.1/tcp/4001",
    ):
        assert gone not in out
    assert out[out.index("--threads") + 1] == "1" and out[out.index("--join") + 1] == "@invite.txt"
    # the last --state-dir wins (click): the co-tenant's own, under the volunteer's
    assert out[len(out) - 1 - out[::-1].index("--state-dir") + 1] == str(tmp_path / "cotenant")
    assert out[out.index("--cotenant-of") + 1] == "12D3KooWHost"
    assert out[out.index("--host-maddrs") + 1] == "/ip4/127.0.0.1/tcp/0"  # same host, a free port
    assert out[out.index("--checkpoint-dir") + 1] == "/ckpt/mine-cotenant"


def test_the_cotenant_reads_the_volunteers_data_and_keeps_its_own_key(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").write_text("shared text")
    root = prepare(tmp_path)
    assert (root / "data" / "corpus.txt").read_text() == "shared text"
    assert prepare(tmp_path) == root  # again: nothing to redo


def test_a_cotenant_that_will_not_leave_is_killed_and_reaped():
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"1\n"  # SIGTERM is ignored from here
    reap(child, timeout_s=0.5)
    assert child.returncode == -signal.SIGKILL
    child.stdout.close()


def test_each_leave_signal_of_the_volunteers_peer_is_passed_on_to_its_cotenant():
    """The first SIGINT/SIGTERM asks both peers to hand over and leave; a second one, to leave at once."""
    code = (
        "import signal, sys, time\n"
        "n = 0\n"
        "def on(*_):\n"
        "    global n; n += 1; print(n, flush=True)\n"
        "signal.signal(signal.SIGTERM, on)\n"
        "print(0, flush=True)\n"
        "while n < 2: time.sleep(0.01)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"0\n"
    daemon = SimpleNamespace(stop_event=asyncio.Event(), leave_now=asyncio.Event())

    async def leave_twice() -> None:
        relay = asyncio.create_task(_pass_on(daemon, child))  # type: ignore[arg-type]
        daemon.stop_event.set()
        assert await asyncio.to_thread(child.stdout.readline) == b"1\n"
        daemon.leave_now.set()
        assert await asyncio.to_thread(child.stdout.readline) == b"2\n"
        await asyncio.wait_for(relay, 5)

    asyncio.run(leave_twice())
    assert child.wait(timeout=10) == 0
    child.stdout.close()
