"""The CPU offloading tier: a fixed pool of CPU blocks with pluggable eviction."""

from __future__ import annotations

from offload_core.cpu.common import CPU_MEDIUM, CPULoadStoreSpec
from offload_core.cpu.filtered import FilteredOffloadingManager
from offload_core.cpu.manager import CPUOffloadingManager
from offload_core.cpu.policies import ARCPolicy, EvictionPolicy, LRUPolicy, make_policy

__all__ = [
    "CPU_MEDIUM",
    "ARCPolicy",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "EvictionPolicy",
    "FilteredOffloadingManager",
    "LRUPolicy",
    "make_policy",
]
