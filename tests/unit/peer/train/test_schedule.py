import itertools

import pytest

from potluck.peer.train.schedule import in_flight_peak, one_f_one_b, warmups


def simulate(n_stages: int, n_micro: int, run_ahead: int = 0) -> int:
    """Run every stage's op list with real dependencies; return the number of ticks, or fail on deadlock.

    F(s, m) needs F(s-1, m); B(s, m) needs F(s, m) and B(s+1, m) (the last stage's B needs only its F).
    """
    plans = [one_f_one_b(s, n_stages, n_micro, run_ahead) for s in range(n_stages)]
    pos = [0] * n_stages
    done: set[tuple[str, int, int]] = set()
    ticks = 0
    while any(p < len(plan) for p, plan in zip(pos, plans, strict=True)):
        ticks += 1
        ready = []
        for s, plan in enumerate(plans):
            if pos[s] == len(plan):
                continue
            kind, m = plan[pos[s]]
            deps = [("F", s - 1, m)] if kind == "F" and s > 0 else []
            if kind == "B":
                deps = [("F", s, m)] + ([("B", s + 1, m)] if s < n_stages - 1 else [])
            if all(d in done for d in deps):
                ready.append((s, kind, m))
        assert ready, f"deadlock at tick {ticks}: {pos}"
        for s, kind, m in ready:
            done.add((kind, s, m))
            pos[s] += 1
    return ticks


@pytest.mark.parametrize(("n_stages", "n_micro"), [(1, 1), (1, 5), (2, 1), (2, 4), (4, 8), (4, 3), (8, 16)])
def test_schedule_is_complete_bounded_and_deadlock_free(n_stages, n_micro):
    for s in range(n_stages):
        ops = one_f_one_b(s, n_stages, n_micro)
        assert sorted(m for k, m in ops if k == "F") == list(range(n_micro))
        assert sorted(m for k, m in ops if k == "B") == list(range(n_micro))
        assert all(ops.index(("F", m)) < ops.index(("B", m)) for m in range(n_micro))
        assert in_flight_peak(ops) <= min(n_stages - s, n_micro)
    ticks = simulate(n_stages, n_micro)
    # with unit-time ops the flush takes 2 (M + S - 1) ticks: the pipeline bubble is 2 (S - 1)
    assert ticks == 2 * (n_micro + n_stages - 1)


def test_bad_requests():
    with pytest.raises(ValueError):
        one_f_one_b(2, 2, 4)
    with pytest.raises(ValueError):
        one_f_one_b(0, 2, 0)


@pytest.mark.parametrize(
    ("n_stages", "n_micro", "run_ahead"), [(2, 8, 1), (2, 16, 6), (4, 8, 3), (3, 4, 9), (1, 5, 2)]
)
def test_running_ahead_stays_complete_and_deadlock_free(n_stages, n_micro, run_ahead):
    for s in range(n_stages):
        ops = one_f_one_b(s, n_stages, n_micro, run_ahead)
        assert sorted(m for k, m in ops if k == "F") == list(range(n_micro))
        assert sorted(m for k, m in ops if k == "B") == list(range(n_micro))
        extra = run_ahead if s < n_stages - 1 else 0  # the last stage has no round trip to cover
        assert in_flight_peak(ops) == min(n_stages - s + extra, n_micro)
    simulate(n_stages, n_micro, run_ahead)  # asserts on deadlock


def test_a_negative_run_ahead_is_refused():
    with pytest.raises(ValueError):
        one_f_one_b(0, 2, 4, -1)


def makespan(plans: list[list[tuple[str, int]]], compute: float, transfer: float, latency: float) -> float:
    """Seconds until every stage's ops are done when each op takes ``compute`` and every message crosses
    a boundary over a link that carries one message per ``transfer`` seconds per direction (a slow
    uplink: messages queue behind each other) plus ``latency``. Ops run in list order per stage."""
    n = len(plans)
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, micro-batch) -> when its result arrived
    link_free = {(j, d): 0.0 for j in range(n - 1) for d in ("F", "B")}
    pos, clock = [0] * n, [0.0] * n
    while any(p < len(plan) for p, plan in zip(pos, plans, strict=True)):
        progressed = False
        for s, plan in enumerate(plans):
            while pos[s] < len(plan):
                kind, m = plan[pos[s]]
                need = ("F", s - 1, m) if kind == "F" and s > 0 else ("B", s + 1, m) if kind == "B" else None
                if need is not None and need[1] < n and need not in done:
                    break
                start = max(clock[s], done.get(need, 0.0) if need is not None else 0.0)
                clock[s] = start + compute
                # the result crosses to the next stage (forward) or the previous one (backward)
                link = (
                    (s, "F") if kind == "F" and s < n - 1 else (s - 1, "B") if kind == "B" and s > 0 else None
                )
                if link is None:
                    done[(kind, s, m)] = clock[s]
                else:
                    sent = max(clock[s], link_free[link]) + transfer
                    link_free[link] = sent
                    done[(kind, s, m)] = sent + latency
                pos[s] += 1
                progressed = True
        assert progressed, "deadlock"
    return max(clock)


def test_warmups_never_increase_and_the_last_stage_never_runs_ahead():
    for n_stages in (1, 2, 3, 6):
        for run_ahead in (0, 1, 15):
            w = warmups(n_stages, run_ahead)
            assert w[-1] == 0
            assert all(a >= b for a, b in itertools.pairwise(w))


def test_the_last_stage_answering_at_once_overlaps_the_two_directions_of_a_slow_link():
    """Two stages over a slow link (a message takes longer to cross than a micro-batch's compute), 15
    ahead as the planner gives home links: the last stage's gradients go back while activations still
    come, so the step takes about one direction's transfers, not both directions' one after the other
    (what a last stage that ran 15 forwards before its first backward cost)."""
    n_micro, run_ahead, compute, transfer, latency = 16, 15, 0.01, 0.03, 0.05
    plans = [one_f_one_b(s, 2, n_micro, run_ahead) for s in range(2)]
    step = makespan(plans, compute, transfer, latency)
    serial = [[("F", m) for m in range(n_micro)] + [("B", m) for m in range(n_micro)]] * 2
    assert step < 0.65 * makespan(serial, compute, transfer, latency)
    # one direction's 16 transfers, the first activation's way there and the last gradient's way back
    assert step <= n_micro * transfer + 2 * (2 * compute + transfer + latency) + 1e-9
