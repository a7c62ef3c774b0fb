"""The tuning split's verdict on the mean of several runs (``routing_tune.py --verbose``).

    for sp in 1.001,0.999 0.999,1.001; do .venv/bin/python benchmarks/routing_tune.py \
        --workloads mooncake --extra "--worker-speeds $sp" \
        --anchors /tmp/anchors_${sp/,/_}.json --variants ... --verbose > tune_${sp/,/_}.txt; done
    .venv/bin/python benchmarks/routing_tune_mean.py tune.txt tune_1.001_0.999.txt ...

One run of a Mooncake cell moves by a few tenths of a point of hit rate and several per
cent of TTFT p99 when every engine is made 0.1% faster or slower (docs/routing_rounds.md), more
than most variants differ by. Per variant and cell this averages ``kv_aware``'s hit rate
and TTFT p99 over the runs given, and the best anchor's of each run, and counts the cells
where the mean is at or ahead on both -- the held-out grid's "ahead on the mean"
(``routing_grid_spread.py``), for the tuning split. It reads the printed figures (TTFT p99
to the millisecond since round 16, to 10 ms before): a tie at that precision counts as at
or ahead.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

# "  name workload|N|cache|load   hit H (best B) p50 M (best B) p99 P (best B) imb I ..."
_LINE = re.compile(
    r"^\s+(?P<variant>\S+) (?P<cell>\S+\|\d+\|\w+\|[\d.]+)\s+hit (?P<hit>[\d.]+) "
    r"\(best (?P<best_hit>[\d.]+)\) p50 [\d.]+ \(best [\d.]+\) p99 (?P<p99>[\d.]+) "
    r"\(best (?P<best_p99>[\d.]+)\)"
)

Runs = dict[tuple[str, str], list[tuple[float, float, float, float]]]


def parse(texts: list[str]) -> Runs:
    """(variant, cell) -> one (hit, best anchor hit, p99, best anchor p99) per run."""
    runs: Runs = defaultdict(list)
    for text in texts:
        for line in text.splitlines():
            m = _LINE.match(line)
            if m:
                key = (m["variant"], m["cell"])
                values = (m["hit"], m["best_hit"], m["p99"], m["best_p99"])
                runs[key].append(tuple(float(v) for v in values))  # type: ignore[arg-type]
    return runs


def verdicts(runs: Runs) -> dict[str, tuple[int, int, int, int]]:
    """Variant -> (cells ahead on the mean, of them on hit rate, on p99, cells)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for (variant, _), rs in runs.items():
        k = len(rs)
        hit, best_hit, p99, best_p99 = (sum(r[i] for r in rs) / k for i in range(4))
        counts = out[variant]
        counts[0] += hit >= best_hit and p99 <= best_p99
        counts[1] += hit >= best_hit
        counts[2] += p99 <= best_p99
        counts[3] += 1
    return {v: (c[0], c[1], c[2], c[3]) for v, c in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+", help="routing_tune.py --verbose outputs")
    args = ap.parse_args()
    runs = parse([Path(p).read_text() for p in args.paths])
    per_variant: dict[str, set[int]] = defaultdict(set)
    for (variant, _), rs in runs.items():
        per_variant[variant].add(len(rs))
    for variant, (won, hit, p99, cells) in sorted(verdicts(runs).items()):
        n = "/".join(str(k) for k in sorted(per_variant[variant]))
        print(f"{variant:10s} ahead on the mean of {n} runs: {won}/{cells} (hit {hit}, p99 {p99})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
