"""Fault injection for tests and benchmarks: kill a peer at a step, delay a peer's steps, drop a link.

A fault is a ``FaultPlan`` (``net/faults.py``) that real peers read from ``POTLUCK_FAULTS`` where
they build the part it touches, so nothing here patches potluck's code: it only says what to break.

    swarm.start_peer("p1", env=as_env(kill_at(12)))             # a process crashes after step 12
    with injected(delay(0.05)):                                  # every peer started inside (or built
        ...                                                      # in-process) sleeps 50 ms a step
    with injected(delay(1.5, replicas=[2]), drop_links(pid)):   # replica 2 straggles; no traffic
        ...                                                      # to or from pid

``injected`` sets the variable of this process for the block (children inherit it); ``as_env`` gives
it for one child only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from potluck.net.faults import ENV, NO_FAULTS, Delay, FaultPlan


def delay(seconds: float, replicas: Sequence[int] | None = None) -> FaultPlan:
    """Peers (of ``replicas`` only, when given) sleep ``seconds`` per step before their replica sync."""
    return FaultPlan(delays=[Delay(seconds=seconds, replicas=None if replicas is None else list(replicas))])


def kill_at(step: int) -> FaultPlan:
    """The peer kills its own process (SIGKILL) right after it committed ``step`` steps."""
    return FaultPlan(kill_at_step=step)


def drop_links(*peers: str) -> FaultPlan:
    """The peer neither sends to nor accepts from ``peers`` on its training mailbox."""
    return FaultPlan(drop=list(peers))


def combine(*plans: FaultPlan) -> FaultPlan:
    """Every fault of ``plans`` at once (the first kill step, if several name one)."""
    kills = [p.kill_at_step for p in plans if p.kill_at_step is not None]
    return FaultPlan(
        delays=[d for p in plans for d in p.delays],
        kill_at_step=min(kills) if kills else None,
        drop=sorted({peer for p in plans for peer in p.drop}),
    )


def encode(*plans: FaultPlan) -> str:
    """The value of ``POTLUCK_FAULTS`` (``ENV``) for these faults: ``monkeypatch.setenv(ENV, encode(f))``."""
    return combine(*plans).model_dump_json(exclude_defaults=True)


def as_env(*plans: FaultPlan) -> dict[str, str]:
    """The environment entry that gives a child process these faults."""
    return {ENV: encode(*plans)}


@contextmanager
def injected(*plans: FaultPlan) -> Iterator[FaultPlan]:
    """These faults for this process (and the children it starts) inside the block; the variable is
    restored after, whatever happens."""
    plan = combine(*plans) if plans else NO_FAULTS
    before = os.environ.get(ENV)
    os.environ[ENV] = encode(plan)
    try:
        yield plan
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
