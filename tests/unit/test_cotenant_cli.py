"""``potluck peer --share-device``: the co-tenant's command line and state directory (cli/cotenant.py)."""

import signal
import subprocess
import sys
from pathlib import Path

from potluck.cli.cotenant import cotenant_argv, prepare, reap


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
