"""What a test of the WAN testbed needs from the machine: Linux, root, /dev/net/tun and iproute2's
``ip`` (network namespaces and TUN devices). ``NEEDS_WAN_TESTBED`` skips such a test elsewhere, saying
which one is missing."""

import os
import shutil
import sys

import pytest

NEEDS_WAN_TESTBED = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux only"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the WAN testbed needs root (namespaces, TUN devices)"),
    pytest.mark.skipif(not os.path.exists("/dev/net/tun"), reason="no /dev/net/tun (kernel TUN driver)"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2's `ip` is not installed"),
]
