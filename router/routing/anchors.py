"""The anchors: other routers' published default policies, re-implemented as baselines.

Each reads the same per-worker view as ``kv_aware`` (the scorer's HMA-exact, tier-weighted
hits; the router's in-flight accounting; engine-reported queue depth and KV usage where
the anchor scrapes them), so ``kvroute bench routing`` compares decision rules, not
indexes. Defaults are the published ones, cited per class; the formulas are restated
from the public documentation, not copied code. Each names in ``settings`` the knobs its
router exposes (``make_policy(name, settings)``; ``kvroute bench routing
--policy-setting``), so a user can compare against the anchor as they deploy it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from router.routing.base import (
    Choice,
    Policy,
    PolicyWeights,
    RouteInput,
    WorkerView,
    pick_min,
    worker_load,
)


class DynamoPolicy(Policy):
    """NVIDIA Dynamo's KV router cost (docs.nvidia.com/dynamo, "Routing Concepts",
    "Configuration and Tuning")::

        cost_w = overlap_score_weight * prefill_blocks_w + decode_blocks_w

    ``prefill_blocks``: the worker's active prompt-side load (tokens dispatched and not
    yet past their first token) plus this request's tokens, less its device-local
    overlap, in blocks; ``decode_blocks``: blocks of the worker's active sequences plus
    this request's. Defaults: ``--router-kv-overlap-score-weight 1``,
    ``--router-temperature 0`` (argmin, no sampling), host-pinned (CPU) overlap credited
    at ``--router-host-cache-hit-weight 0.75``.
    """

    name = "dynamo"
    settings = ("overlap_score_weight", "host_hit_weight")
    overlap_score_weight = 1.0
    host_hit_weight = 0.75

    def costs(
        self,
        request: RouteInput,
        views: Sequence[WorkerView],
        loads: list[float],
        weights: PolicyWeights,
    ) -> list[float]:
        n = request.request_tokens
        bs = float(max(request.block_tokens, 1))
        out = []
        for v in views:
            gpu = min(v.hit_tokens_gpu, v.hit_tokens)
            overlap = gpu + self.host_hit_weight * (v.hit_tokens - gpu)
            prefill = (v.prefill_backlog + n - overlap) / bs
            decode = (v.inflight_tokens + n) / bs
            out.append(self.overlap_score_weight * prefill + decode)
        return out


class SGLangCacheAwarePolicy(Policy):
    """SGLang's router ``cache_aware`` policy, sgl-router library defaults
    (``CacheAwareConfig::default``: cache_threshold 0.5, balance_abs_threshold 32,
    balance_rel_threshold 1.1; docs.sglang.io "SGLang Model Gateway").

    Gate: when ``max_load - min_load > abs`` and ``max_load > rel * min_load`` (load =
    requests in flight) the least-loaded worker wins. Otherwise the worker with the
    longest prefix match wins if its match ratio exceeds ``cache_threshold``; below it,
    the worker with the smallest cache ("smallest tree"). Matches come from the KV-event
    index (SMG's event-driven flavour), not an approximate tree of routed text.
    """

    name = "sglang"
    settings = ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold")
    cache_threshold = 0.5
    balance_abs_threshold = 32
    balance_rel_threshold = 1.1

    def choose_index(
        self, request: RouteInput, views: Sequence[WorkerView], rng: random.Random
    ) -> int:
        loads = [v.inflight for v in views]
        lo, hi = min(loads), max(loads)
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            return pick_min([float(x) for x in loads], rng)
        hits = [float(v.hit_tokens) for v in views]
        best = pick_min([-h for h in hits], rng)
        if hits[best] / max(request.request_tokens, 1) > self.cache_threshold:
            return best
        sizes = [
            float(v.engine.cached_blocks if v.engine.cached_blocks >= 0 else v.inflight)
            for v in views
        ]
        return pick_min(sizes, rng)

    def choose(
        self,
        request: RouteInput,
        views: Sequence[WorkerView],
        weights: PolicyWeights,
        rng: random.Random,
    ) -> Choice:
        loads = [worker_load(v, weights) for v in views]
        return Choice(self.choose_index(request, views, rng), loads, [0.0] * len(views))


class SMGCacheAwarePolicy(SGLangCacheAwarePolicy):
    """The same gate with the SGLang Model Gateway (SMG) command-line defaults
    (``smg --policy cache_aware``: --cache-threshold 0.3, --balance-abs-threshold 64,
    --balance-rel-threshold 1.5; lightseekorg/smg docs, "Load Balancing")."""

    name = "sglang_smg"
    cache_threshold = 0.3
    balance_abs_threshold = 64
    balance_rel_threshold = 1.5


class LlmdPolicy(Policy):
    """llm-d's default scheduling profile (llm-d.ai inference scheduler; Red Hat OpenShift
    AI "Configuring scheduler settings"): highest weighted sum of scorers in [0, 1] --
    prefix-cache scorer (weight 3; the *precise* flavour, fed by KV events: matched
    fraction of the prompt), queue scorer (weight 2; min-max normalised waiting queue,
    shorter is better) and KV-cache-utilization scorer (weight 2; ``1 - usage``).
    """

    name = "llmd"
    settings = ("prefix_weight", "queue_weight", "kv_weight")
    prefix_weight = 3.0
    queue_weight = 2.0
    kv_weight = 2.0

    def costs(
        self,
        request: RouteInput,
        views: Sequence[WorkerView],
        loads: list[float],
        weights: PolicyWeights,
    ) -> list[float]:
        n = max(request.request_tokens, 1)
        queues = [v.engine.queue_depth if v.engine.queue_depth >= 0 else v.inflight for v in views]
        lo, hi = min(queues), max(queues)
        out = []
        for v, q in zip(views, queues, strict=True):
            prefix = min(v.score / n, 1.0)
            queue = 1.0 if hi == lo else (hi - q) / (hi - lo)
            kv = 1.0 - v.engine.kv_usage if v.engine.kv_usage >= 0 else 1.0
            total = self.prefix_weight * prefix + self.queue_weight * queue + self.kv_weight * kv
            out.append(-total)
        return out


ANCHOR_CLASSES: tuple[type[Policy], ...] = (
    DynamoPolicy,
    SGLangCacheAwarePolicy,
    SMGCacheAwarePolicy,
    LlmdPolicy,
)
