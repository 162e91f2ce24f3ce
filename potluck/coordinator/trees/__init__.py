"""Spanning-tree packing for collectives over measured peer links (Blink, MLSys 2020), pure.

``pack_allreduce`` is the entry point the planner and benchmarks call; ``pack_broadcast`` packs rooted
arborescences; ``pack_rings`` packs directed Hamiltonian rings (the NCCL-style baseline). Plans for the
executor and the time model are in ``potluck.coordinator.trees.plan``. Guide: docs/collectives.md.
"""

from __future__ import annotations

from potluck.coordinator.errors import PackingError
from potluck.coordinator.trees.bounds import exact_strength
from potluck.coordinator.trees.packer import (
    Certificate,
    Packing,
    PackingStats,
    pack_allreduce,
    pack_broadcast,
)
from potluck.coordinator.trees.rings import RingPacking, pack_rings

__all__ = [
    "Certificate",
    "Packing",
    "PackingError",
    "PackingStats",
    "RingPacking",
    "exact_strength",
    "pack_allreduce",
    "pack_broadcast",
    "pack_rings",
]
