"""Our engine's cache core against vLLM 0.33 on the conformance recordings (made by
``conformance/vllm_driver.py`` from vLLM's own ``KVCacheManager``): the same actions
through ``parity/rank_sim.RankSim`` must give the same probe answers, the same hits at
admission and the same published frames, decoded and compared field by field."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas import KVEvent, decode_batch

sys.path.insert(0, str(Path(__file__).parent / "parity"))
from rank_sim import RankSim, groups_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-conformance"
RECORDINGS = sorted(p.stem for p in FIXTURES.glob("*.msgpack"))
MAX_DRAIN_STEPS = 20_000


def _events(events: list[KVEvent]) -> list[dict[str, Any]]:
    return [{"type": type(e).__name__, **msgspec.structs.asdict(e)} for e in events]


def expected(rec: dict[str, Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for s in rec["steps"]:
        if s["op"] == "probe":
            out.append(("probe", s["dp_rank"], s["request_id"], s["expected_hit_tokens"]))
        elif s["op"] == "admit":
            out.append(("admit", s["dp_rank"], s["request_id"], s["hit_tokens"]))
        elif s["op"] == "frame":
            out.append(("frame", s["dp_rank"], _events(decode_batch(s["payload"]).events)))
    return out


def ours(rec: dict[str, Any]) -> list[tuple[Any, ...]]:
    worker = rec["worker"]
    groups = groups_of(rec["groups"])
    budget = rec.get("token_budget") or _budget(rec["scenario"])
    sims = [RankSim(groups, worker, budget) for _ in range(worker.get("dp_ranks", 1))]
    out: list[tuple[Any, ...]] = []
    where: dict[str, int] = {}

    def step() -> None:
        for rank, sim in enumerate(sims):
            admits, events = sim.step()
            out.extend(("admit", rank, rid, hit) for rid, hit in admits)
            if events:
                out.append(("frame", rank, _events(events)))

    for s in rec["steps"]:
        if s["op"] != "action":
            continue
        a = s["action"]
        if a["op"] == "add":
            where[a["request_id"]] = a["dp_rank"]
            hit = sims[a["dp_rank"]].add(a)
            out.append(("probe", a["dp_rank"], a["request_id"], hit))
        elif a["op"] == "abort":
            sims[where[a["request_id"]]].abort(a["request_id"])
        elif a["op"] == "step":
            step()
        elif a["op"] == "drain":
            for _ in range(MAX_DRAIN_STEPS):
                if not any(sim.busy for sim in sims):
                    break
                step()
    return out


def _budget(scenario: str) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from conformance.scenarios import SCENARIOS

    return next(sc.token_budget for sc in SCENARIOS if sc.name == scenario)


@pytest.mark.parametrize("name", RECORDINGS)
def test_engine_core_matches_vllm_recording(name: str) -> None:
    rec = msgspec.msgpack.decode((FIXTURES / f"{name}.msgpack").read_bytes())
    want, got = expected(rec), ours(rec)
    for i, (w, g) in enumerate(zip(want, got, strict=False)):
        assert g == w, f"item {i} of {len(want)} differs:\n ours {g}\n vllm {w}"
    assert len(got) == len(want)
