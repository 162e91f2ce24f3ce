"""An emulated WAN for real processes: one network namespace per peer, and a userspace relay that
gives each direction of each pair the scenario's one-way delay and rate (the kernel here has no
``netem``). ``WanLab(load_spec("home-5", bandwidth_scale=...))`` builds it; ``check.measure(lab)``
measures it.
See docs/testbed.md.
"""

from potluck.testbed.wan.lab import WanLab, sigterm_raises, stale_namespaces
from potluck.testbed.wan.spec import LinkTarget, WanSpec, link_targets, load_spec

__all__ = [
    "LinkTarget",
    "WanLab",
    "WanSpec",
    "link_targets",
    "load_spec",
    "sigterm_raises",
    "stale_namespaces",
]
