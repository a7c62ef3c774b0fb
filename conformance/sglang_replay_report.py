"""Exact probes per SGLang recording and index backend (the table in docs/sglang.md).

Runs in kvroute's own venv: ``.venv/bin/python conformance/sglang_replay_report.py
[--redis-url redis://127.0.0.1:6379/0]``. The recordings are replayed exactly as
``tests/conformance/test_sglang_recordings.py`` does; this prints the counts instead of
asserting them.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import msgspec

from router.index import make_index
from router.ingest.ingestor import Ingestor
from router.score.scorer import Scorer
from schemas import DecodeStats, decode_batch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sglang-0.5"
SCENARIOS = ("page1", "page16", "salted", "host")


async def replay(name: str, kind: str, url: str | None) -> str:
    rec = msgspec.msgpack.decode((FIXTURES / f"{name}.msgpack").read_bytes())
    index = make_index(kind, url)
    ingestor, scorer, stats = Ingestor(index), Scorer(index), DecodeStats()
    await index.remove_worker("w")
    fed = exact = 0
    for probe in rec["probes"]:
        while fed < probe["after_batches"]:
            await ingestor.apply_batch("w", decode_batch(rec["frames"][fed][2], stats))
            fed += 1
        w = (
            await scorer.score(
                probe["token_ids"],
                ["w"],
                cache_salt=probe["cache_salt"],
                lora_name=probe["lora_name"],
            )
        ).workers[0]
        exact += (w.hit_tokens, w.hit_tokens_gpu) == (probe["hit_tokens"], probe["hit_tokens_gpu"])
    c = ingestor.counters
    await index.close()
    rejected = stats.malformed_events + c.bad_events + c.unknown_parent
    return f"| {name} | {kind} | {exact}/{len(rec['probes'])} | {rejected} |"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--redis-url")
    args = ap.parse_args()
    print("| scenario | index | exact probes | events rejected |\n|---|---|---|---|")
    for name in SCENARIOS:
        for kind in ("memory", "redis") if args.redis_url else ("memory",):
            print(await replay(name, kind, args.redis_url))


if __name__ == "__main__":
    asyncio.run(main())
