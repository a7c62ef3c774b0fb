"""Load SGLang's cache modules in a CPU-only venv.

Why a stub: ``sglang.srt.configs`` imports an InternVL image helper that imports
``torchvision`` at module level. The registry's torchvision wheels link against CUDA
torch, and the pinned torch here is the CPU build, so the real package cannot load. The
prefix cache, its event recorder and the publisher never touch torchvision; an empty
placeholder module satisfies that one import. Nothing else is replaced.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def install_torchvision_placeholder() -> None:
    """Register an empty ``torchvision`` unless a working one is importable."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    import transformers.utils.import_utils  # noqa: F401  (decides availability first)

    names = (
        "torchvision",
        "torchvision.transforms",
        "torchvision.transforms.functional",
        "torchvision.transforms.v2",
        "torchvision.io",
    )
    for name in names:
        sys.modules[name] = _Placeholder(name)
    for name in names[1:]:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, sys.modules[name])


class _Placeholder(types.ModuleType):
    """Any attribute is an inert class: names are referenced at import, never used."""

    def __getattr__(self, attr: str) -> type:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {})
