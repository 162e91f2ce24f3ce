import pytest

from potluck.peer.train.schedule import in_flight_peak, one_f_one_b


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
        assert in_flight_peak(ops) == min(n_stages - s + run_ahead, n_micro)
    simulate(n_stages, n_micro, run_ahead)  # asserts on deadlock


def test_a_negative_run_ahead_is_refused():
    with pytest.raises(ValueError):
        one_f_one_b(0, 2, 4, -1)
