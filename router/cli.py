"""The ``kvroute`` console script: a thin dispatcher.

Each subcommand lives in its own module with a ``main(argv) -> int``, imported inside its
dispatch function, so ``kvroute serve`` never imports torch (only ``kvroute engine`` does).
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable


def _serve(argv: list[str]) -> int:
    from router.serve import main as run

    return run(argv)


def _engine(argv: list[str]) -> int:
    from offload_core.engine_cli import main as run  # torch: only here

    return run(argv)


def _demo(argv: list[str]) -> int:
    from router.ops.demo import main as run

    return run(argv)


def _bench(argv: list[str]) -> int:
    from router.bench import main as run

    return run(argv)


def _tail(argv: list[str]) -> int:
    from router.ops.tail import main as run

    return run(argv)


SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "serve": (_serve, "run the cache-aware router (REST API + event ingestion)"),
    "engine": (_engine, "run a simulated engine worker that publishes KV events"),
    "demo": (_demo, "start engines + router, replay a workload, compare policies"),
    "bench": (_bench, "benchmarks (e.g. `kvroute bench routing --trace FILE`)"),
    "tail": (_tail, "pretty-print a live vLLM-format KV event stream"),
}


# Optional dependencies a subcommand needs, and the extra that installs them.
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {"engine": (("torch",), "engine")}


def version() -> str:
    try:
        return importlib.metadata.version("kvroute")
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        return "unknown"


def _usage() -> str:
    lines = ["usage: kvroute [--version] <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines.append("\nrun `kvroute <command> --help` for a command's options")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"kvroute {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"kvroute: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        return int(SUBCOMMANDS[name][0](rest) or 0)
    except ModuleNotFoundError as exc:
        needs, extra = EXTRAS.get(name, ((), ""))
        if exc.name is None or exc.name.partition(".")[0] not in needs:
            raise
        print(
            f"kvroute {name}: needs {exc.name}, which is not installed; "
            f"install it with: pip install 'kvroute[{extra}]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
