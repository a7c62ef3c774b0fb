"""The import graph: no cycles (runtime, function-level and type-checking imports alike);
the direction rules are import-linter contracts in pyproject.toml (``make lint``)."""

from __future__ import annotations

from collections.abc import Iterator

import grimp

PACKAGES = ("schemas", "publisher", "offload_core", "router")


def _imports(graph: grimp.ImportGraph, module: str) -> Iterator[str]:
    return iter(sorted(graph.find_modules_directly_imported_by(module)))


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, _imports(graph, root))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles() -> None:
    graph = grimp.build_graph(*PACKAGES)
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "b", "c"):
        graph.add_module(m)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    assert _cycles(graph) == [["a", "b", "c"]]


# Sub-packages tested one level up, with the reason.
TESTED_WITH_PARENT = {
    "offload_core/cpu/policies": "tests/offload_core/cpu/test_cpu_policies.py",
    "router/bench/workloads": "tests/router/bench/test_workloads.py",
    "schemas/tokenization": "tests/schemas/test_chat_parity_vllm.py",
}


def test_tests_mirror_the_package_tree() -> None:
    """Every package folder has its test folder (tests/<same path>), so a module's tests
    are found by its path."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    missing = []
    for pkg in PACKAGES:
        for init in sorted((root / pkg).rglob("__init__.py")):
            folder = init.parent.relative_to(root).as_posix()
            if folder in TESTED_WITH_PARENT:
                assert (root / TESTED_WITH_PARENT[folder]).is_file(), folder
                continue
            modules = [p for p in init.parent.glob("*.py") if p.name != "__init__.py"]
            if modules and not (root / "tests" / folder).is_dir():
                missing.append(folder)
    assert not missing, f"package folders without tests/<folder>: {missing}"
