"""The CPU tier's load/store spec: which CPU block ids hold (or will hold) the blocks."""

from __future__ import annotations

from dataclasses import dataclass

from offload_core.base import LoadStoreSpec

CPU_MEDIUM = "CPU"


@dataclass(slots=True)
class CPULoadStoreSpec(LoadStoreSpec):
    """CPU block ids, index-aligned with the keys of the call that produced the spec."""

    block_ids: list[int]

    @staticmethod
    def medium() -> str:
        return CPU_MEDIUM
