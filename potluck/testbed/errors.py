"""Errors of the testbed package. Each carries a message a user can act on."""

from __future__ import annotations

from potluck.errors import PotluckError


class TestbedError(PotluckError):
    """The emulated network cannot be built, measured or torn down (not root, no TUN, bad scenario)."""

    __test__ = False  # not a pytest test class, despite the name
