"""Process-wide settings that third-party libraries need."""

from __future__ import annotations

import logging
import multiprocessing as mp

logger = logging.getLogger(__name__)


def use_fork() -> None:
    """Make ``fork`` the multiprocessing start method.

    Why: hivemind 1.1.12's ``DHT`` and ``DecentralizedAverager`` are ``mp.Process`` subclasses whose
    state (pipes, the p2pd handle, asyncio objects) does not survive pickling; under ``spawn`` or
    ``forkserver`` (the Linux default from Python 3.14) they fail to start. potluck's own nodes run
    hivemind's ``DHTNode`` in-process and do not need this; entry points and benchmarks that use those
    hivemind classes do.
    """
    current = mp.get_start_method(allow_none=True)
    if current == "fork":
        return
    if current is not None:
        logger.info("switching multiprocessing start method from %s to fork (hivemind needs it)", current)
    mp.set_start_method("fork", force=True)
