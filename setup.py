"""Builds kvroute's optional compiled core (``router/native/*.c``; see
docs/development.md#the-native-core). Metadata lives in pyproject.toml.

The extension is optional: when it cannot compile, the install goes on and the router
uses its pure-Python paths (same answers). The chain hash inside it needs libxxhash's
header (Debian: ``libxxhash-dev``); without it the extension builds without ``chain``.
"""

from __future__ import annotations

import os
import tempfile

from setuptools import Extension, setup

_SOURCES = (
    "_core",
    "map",
    "map_type",
    "map_scan",
    "map_store",
    "map_remove",
    "chain",
    "chain_packed",
    "wire_tokens",
    "rows",
    "rows_classify",
    "proto",
    "pack",
    "sweep",
    "window",
)


def _has_xxhash() -> bool:
    """Whether ``xxhash.h`` and ``-lxxhash`` compile and link here."""
    if os.environ.get("KVROUTE_NATIVE_XXHASH", "1") == "0":
        return False
    try:
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.sysconfig import customize_compiler
    except ImportError:  # pragma: no cover - very old setuptools
        return False
    cc = new_compiler()
    customize_compiler(cc)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(
                "#include <xxhash.h>\n"
                'int main(void) { return (int)(XXH3_64bits_withSeed("a", 1, 1) & 0); }\n'
            )
        try:
            objs = cc.compile([src], output_dir=tmp)
            cc.link_executable(objs, os.path.join(tmp, "probe"), libraries=["xxhash"])
        except Exception:
            return False
    return True


def _extensions() -> list[Extension]:
    if os.environ.get("KVROUTE_NATIVE_BUILD", "1") == "0":
        return []
    xx = _has_xxhash()
    return [
        Extension(
            "router.native._core",
            sources=[f"router/native/{name}.c" for name in _SOURCES],
            depends=["router/native/core.h", "router/native/rows.h", "router/native/memo.h"],
            define_macros=[("KVR_XXHASH", "1")] if xx else [],
            libraries=["xxhash"] if xx else [],
            extra_compile_args=["-O3"],
            optional=True,  # a failed compile leaves the pure-Python paths
        )
    ]


setup(ext_modules=_extensions())
