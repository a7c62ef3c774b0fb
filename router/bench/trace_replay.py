"""One pass over a workload, replayed into several fleets in lock step, plus the bounds."""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from offload_core.kv_cache import KVCacheManager
from router.bench.charged import ChargedModel
from router.bench.charged_fleet import ChargedFleet
from router.bench.sim import CostModel, EventFilter, Fleet, InfiniteCacheBound, SharedCacheBound
from router.bench.workloads import Request
from router.routing.state import RoutingConfig
from schemas import BlockRemoved, BlockStored, KVEvent
from schemas.hit_rule import FULL_KINDS, KIND_FULL, GroupSpec

Progress = Callable[[int], None]


@dataclass(frozen=True)
class FleetSpec:
    """One fleet of the replay: a name in the output, the policy, how its index is fed."""

    name: str
    policy: str
    event_filter: EventFilter | None = None
    routing: RoutingConfig | None = None  # overrides ReplayConfig.routing (weight sweeps)


@dataclass
class ReplayConfig:
    workers: int = 8
    gpu_blocks: int = 1024
    groups: list[GroupSpec] = field(default_factory=lambda: [GroupSpec(KIND_FULL, 512)])
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    cost: CostModel = field(default_factory=CostModel)
    hash_algo: str = "sha256"
    event_delay_s: float = 0.0
    truth_all_workers: bool = False
    hold_blocks: bool = False
    # "simple": one prefill at a time, free decode (the original figures); "charged":
    # router.bench.charged (continuous batching, held blocks, learned speeds).
    engine_model: str = "simple"
    charged: ChargedModel = field(default_factory=ChargedModel)
    worker_speeds: tuple[float, ...] = ()


async def replay(
    workload: Iterable[Request],
    fleets: Sequence[FleetSpec],
    cfg: ReplayConfig,
    progress: Progress | None = None,
    *,
    bounds: bool = True,
) -> dict[str, Any]:
    """Replay ``workload`` into every fleet; returns per-fleet summaries and (with
    ``bounds``) the shared-cache and infinite-cache hit rates."""
    built = {
        f.name: _fleet(
            cfg,
            f.policy,
            workers=cfg.workers,
            gpu_blocks=cfg.gpu_blocks,
            groups=cfg.groups,
            routing=f.routing or cfg.routing,
            cost=cfg.cost,
            hash_algo=cfg.hash_algo,
            event_delay_s=cfg.event_delay_s,
            event_filter=f.event_filter,
            truth_all_workers=cfg.truth_all_workers,
            hold_blocks=cfg.hold_blocks,
        )
        for f in fleets
    }
    shared = SharedCacheBound(cfg.groups, cfg.workers * cfg.gpu_blocks, cfg.hash_algo)
    infinite = InfiniteCacheBound(cfg.groups)
    hasher = KVCacheManager(cfg.groups, 1, cfg.hash_algo, enable_events=False)
    timings = {"hash_s": 0.0, "fleets_s": 0.0, "bounds_s": 0.0}
    t_start = time.perf_counter()
    count = 0
    for req in workload:
        t0 = time.perf_counter()
        prepared = hasher.make_request(req.token_ids)
        # The scorers' first step is an int32 array of the prompt: built once, shared.
        packed = array("i", req.token_ids)
        t1 = time.perf_counter()
        for fleet in built.values():
            await fleet.step(req, prepared, packed)
        t2 = time.perf_counter()
        if bounds:
            shared.step(prepared)
            infinite.step(prepared)
        t3 = time.perf_counter()
        timings["hash_s"] += t1 - t0
        timings["fleets_s"] += t2 - t1
        timings["bounds_s"] += t3 - t2
        count += 1
        if progress is not None:
            progress(count)
    for fleet in built.values():
        await fleet.drain()
    timings["total_s"] = time.perf_counter() - t_start
    return {
        "policies": {name: fleet.summary() for name, fleet in built.items()},
        "bounds": (
            {"infinite_cache": infinite.hit_rate, "shared_cache": shared.hit_rate} if bounds else {}
        ),
        "config": {
            "requests": count,
            "workers": cfg.workers,
            "gpu_blocks": cfg.gpu_blocks,
            "groups": [asdict(g) for g in cfg.groups],
            "hash_algo": cfg.hash_algo,
            "event_delay_s": cfg.event_delay_s,
            "hold_blocks": cfg.hold_blocks,
            "cost": asdict(cfg.cost),
            "engine_model": cfg.engine_model,
            **({"charged": asdict(cfg.charged)} if cfg.engine_model == "charged" else {}),
            "worker_speeds": list(cfg.worker_speeds),
            "profile": cfg.routing.profile,
            "weights": asdict(cfg.routing.weights),
            **(
                {"policy_settings": {k: dict(v) for k, v in cfg.routing.policy_settings.items()}}
                if cfg.routing.policy_settings
                else {}
            ),
        },
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }


def _fleet(cfg: ReplayConfig, policy: str, **kwargs: Any) -> Fleet:
    if cfg.engine_model == "charged":
        return ChargedFleet(policy, model=cfg.charged, speeds=cfg.worker_speeds, **kwargs)
    if cfg.engine_model != "simple":
        raise ValueError(f"unknown engine model {cfg.engine_model!r}")
    return Fleet(policy, **kwargs)


# ----------------------------------------------------------------- index variants
def full_groups_only(groups: Sequence[GroupSpec]) -> EventFilter:
    """The index sees only full-attention groups: sliding windows are ignored."""
    keep = {i for i, g in enumerate(groups) if g.kind in FULL_KINDS}

    def apply(events: list[KVEvent]) -> list[KVEvent]:
        out: list[KVEvent] = []
        for ev in events:
            if isinstance(ev, BlockStored | BlockRemoved) and (ev.group_idx or 0) not in keep:
                continue
            out.append(ev)
        return out

    return apply


def every_group_as_full(events: list[KVEvent]) -> list[KVEvent]:
    """The index believes every group is full attention (windows forgotten)."""
    out: list[KVEvent] = []
    for ev in events:
        if isinstance(ev, BlockStored) and ev.kv_cache_spec_kind not in (None, *FULL_KINDS):
            ev = msgspec.structs.replace(
                ev, kv_cache_spec_kind=KIND_FULL, kv_cache_spec_sliding_window=None
            )
        out.append(ev)
    return out
