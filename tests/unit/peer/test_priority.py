"""A newcomer's start-up runs niced and goes back once it trains (``peer/priority.py``): every thread
and child process started after ``lower`` inherits the start-up priority, and ``restore`` puts all of
them back (with CAP_SYS_NICE; without it they stay, said once). In a child interpreter, so the test
run's own priority is never touched."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys, threading, time
    from potluck.peer import priority

    def nice(tid):
        return os.getpriority(os.PRIO_PROCESS, tid)

    base = nice(0)
    lowered = priority.lower(10)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    seen = {}
    ready, done = threading.Event(), threading.Event()
    def worker():
        seen["tid"] = threading.get_native_id()
        ready.set()
        done.wait(30)
    t = threading.Thread(target=worker)
    t.start()
    ready.wait(10)
    time.sleep(0.2)  # the child is running
    during = [nice(0), nice(seen["tid"]), nice(child.pid)]
    # a thread that chose a lower priority of its own (the idle-time check worker's 19) keeps it
    own, own_ready = {}, threading.Event()
    def checker():
        own["tid"] = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, own["tid"], 19)
        own_ready.set()
        done.wait(30)
    t2 = threading.Thread(target=checker)
    t2.start()
    own_ready.wait(10)
    restored = priority.restore()
    after = [nice(0), nice(seen["tid"]), nice(child.pid)]
    kept = nice(own["tid"])
    again = priority.restore()
    done.set(); t.join(10); t2.join(10)
    child.kill(); child.wait(10)
    print(json.dumps({"base": base, "lowered": lowered, "during": during, "restored": restored,
                      "after": after, "again": again, "kept": kept}))
    """
)


def _run(script: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nice per thread and /proc: Linux")
def test_start_up_threads_and_children_run_niced_then_go_back():
    got = _run(SCRIPT)
    if got["base"] >= 10:
        pytest.skip("this test run already runs at nice 10 or lower")
    assert got["lowered"] and got["during"] == [10, 10, 10]
    if os.geteuid() == 0:  # may raise a priority back
        assert got["restored"] and got["after"] == [got["base"]] * 3
    else:  # may not: it stays at the start-up priority and says so
        assert not got["restored"] and got["after"] == [10, 10, 10]
    assert got["again"] is False  # once
    assert got["kept"] == 19


def test_a_lower_priority_is_kept_and_zero_means_normal():
    script = (
        "import json, os; from potluck.peer import priority; os.setpriority(os.PRIO_PROCESS, 0, 15); "
        "a = priority.lower(10); b = priority.restore(); "
        "print(json.dumps([a, b, os.getpriority(os.PRIO_PROCESS, 0)]))"
    )
    assert _run(script) == [False, False, 15]  # started under nice 15: left there
    assert _run("import json; from potluck.peer import priority; print(json.dumps([priority.lower(0)]))") == [
        False
    ]
