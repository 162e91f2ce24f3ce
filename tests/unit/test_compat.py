import multiprocessing as mp

from potluck.compat import use_fork


def test_use_fork_sets_fork():
    before = mp.get_start_method(allow_none=True)
    try:
        mp.set_start_method("spawn", force=True)
        use_fork()
        assert mp.get_start_method() == "fork"
    finally:
        mp.set_start_method(before, force=True)
