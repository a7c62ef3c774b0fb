"""``Proxy``: the state behind the OpenAI endpoints and the routing glue.

Per request: the candidate workers (serving the model, live), token ids (tokenizer or
token-id prompt), scores from the index, then ``RoutingCore.route`` - the very decision
code behind ``/v1/route`` - and ``finish`` when the response ends. A retry routes again
among the workers not tried yet, so the next-best worker by the policy's cost gets it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from router.config import RouterSettings
from router.index import IndexUnavailable
from router.proxy.health import STREAM_OK, HealthMonitor
from router.proxy.metrics import ProxyCounters
from router.proxy.upstream import UpstreamPool
from router.routing.state import Decision, RoutingCore
from router.service import RouterService
from schemas.tokenization import NotTokenizable, TokenizerRegistry, completion_tokens

log = logging.getLogger(__name__)


class ProxyError(Exception):
    """Answered to the client as ``{"error": {"code", "message"}}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True, slots=True)
class _NoScore:
    """A worker's score when the index cannot answer: routing falls back to load."""

    worker_id: str
    hit_tokens: int = 0
    hit_tokens_gpu: int = 0
    score: float = 0.0


def make_client(settings: RouterSettings) -> httpx.AsyncClient:
    """A pooled httpx client (HTTP/1.1 keep-alive) for the ``/tokenize`` pass-through."""
    timeout = httpx.Timeout(
        settings.proxy_timeout_s,
        connect=settings.proxy_connect_timeout_s,
        pool=settings.proxy_connect_timeout_s,
    )
    limits = httpx.Limits(
        max_connections=settings.proxy_max_connections,
        max_keepalive_connections=settings.proxy_max_connections,
        keepalive_expiry=30.0,
    )
    key = settings.engine_api_key
    headers = {"authorization": f"Bearer {key}"} if key else None
    return httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False, headers=headers)


class Proxy:
    def __init__(self, service: RouterService) -> None:
        s = service.settings
        self.service = service
        self.settings = s
        self.client = make_client(s)  # the /tokenize pass-through
        self.upstream = UpstreamPool(  # the forwarding hot path (router/proxy/upstream.py)
            connect_timeout=s.proxy_connect_timeout_s,
            read_timeout=s.proxy_timeout_s,
            max_idle_per_host=s.proxy_max_connections,
            api_key=s.engine_api_key,
        )
        self.tokenizers = TokenizerRegistry(s.tokenizers)
        self.tokenizers.load_all()  # a bad path fails at start-up, not on a request
        self.counters = ProxyCounters()
        self.health = HealthMonitor(
            service,
            self.upstream,
            interval_s=s.health_interval_s,
            timeout_s=s.health_timeout_s,
            failures=s.health_failures,
            require_events=s.proxy_require_events,
        )

    @property
    def core(self) -> RoutingCore:
        return self.service.routing  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ models
    def worker_models(self, worker_id: str) -> frozenset[str] | None:
        """The models a worker serves; None when unknown (it then takes any model)."""
        spec = self.service.worker_spec(worker_id)
        if spec.model is not None:
            return frozenset((spec.model,))
        h = self.health.workers.get(worker_id)
        return h.models if h is not None else None

    def models(self) -> list[str]:
        names: set[str] = set()
        for w in self.service.worker_ids():
            names |= self.worker_models(w) or set()
        return sorted(names)

    def requested_model(self, body: Mapping[str, Any]) -> str | None:
        """The body's ``model``; None (any worker) when absent and the fleet serves at
        most one -- vLLM serves its one model -- else 400."""
        model = body.get("model")
        if model is None:
            served = self.models()
            if len(served) > 1:
                raise ProxyError(
                    400, "invalid_request", f"'model' is required: served are {', '.join(served)}"
                )
        elif not isinstance(model, str) or not model:
            raise ProxyError(400, "invalid_request", "'model' must be a non-empty string")
        return model

    def model_card(self, name: str) -> dict[str, object] | None:
        """An engine's own card for ``name`` (vLLM's has ``max_model_len``, ``root``...),
        from the first worker that reported one; None when no engine did."""
        for w in self.service.worker_ids():
            h = self.health.workers.get(w)
            if h is not None and name in h.cards:
                return h.cards[name]
        return None

    def adapter(self, model: object) -> str | None:
        """``model`` when it names a LoRA adapter (its card names the base model as
        ``parent``, as vLLM lists adapters): vLLM selects an adapter by ``model`` and hashes
        the request's blocks with the adapter's name, so the score must too."""
        card = self.model_card(model) if isinstance(model, str) else None
        parent = card.get("parent") if card is not None else None
        return model if isinstance(model, str) and parent and parent != model else None

    def candidates(self, model: str | None) -> list[str]:
        """Live workers serving ``model``; 404 when none serves it, 503 when none is live.

        One pass over the subscriptions with the liveness test inlined: this runs per
        request over every registered worker (64 and more)."""
        health = self.health
        states = STREAM_OK if health.require_events else None
        serving: list[str] = []
        live: list[str] = []
        for sub in self.service.subscriptions.all():
            spec = sub.spec
            h = health.workers.get(spec.worker_id)
            if model is not None:
                if spec.model is not None:
                    if spec.model != model:
                        continue
                elif h is not None and h.models is not None and model not in h.models:
                    continue
            serving.append(spec.worker_id)
            if (
                h is not None
                and h.http_ok
                and spec.http_endpoint is not None
                and (states is None or sub.state in states)
            ):
                live.append(spec.worker_id)
        if not serving:
            known = ", ".join(self.models()) or "none"
            raise ProxyError(
                404, "model_not_found", f"no worker serves model {model!r} (served: {known})"
            )
        if not live:
            why = "; ".join(f"{w}: {health.why_not_live(w)}" for w in serving[:8])
            raise ProxyError(503, "no_live_workers", f"no live worker for {model!r}: {why}")
        return live

    # ------------------------------------------------------------------ tokens
    def tokens(self, body: Mapping[str, Any], chat: bool) -> list[int]:
        model = body.get("model")
        tok = self.tokenizers.get(model if isinstance(model, str) else None)
        if chat:
            if tok is None:
                self.counters.untokenized += 1
                return []
            try:
                return tok.encode_chat(body)
            except NotTokenizable:  # e.g. an image part: the engine's ids are not ours
                self.counters.untokenized += 1
                return []
        ids = completion_tokens(tok, body)
        if ids is None:
            self.counters.untokenized += 1
            return []
        return ids

    # ------------------------------------------------------------------ routing
    async def scores(self, tokens: list[int], workers: list[str], body: Mapping[str, Any]) -> list:
        if not tokens:
            return [_NoScore(w) for w in workers]
        lora, salt = body.get("lora_name"), body.get("cache_salt")
        if not isinstance(lora, str):
            lora = self.adapter(body.get("model"))
        try:
            result = await self.service.score_result(
                tokens,
                workers,
                lora_name=lora if isinstance(lora, str) else None,
                cache_salt=salt if isinstance(salt, str) else None,
            )
        except IndexUnavailable:
            self.counters.index_fallbacks += 1
            return [_NoScore(w) for w in workers]
        return list(result.workers)

    def route(self, tokens: list[int], scores: list, policy: str | None = None) -> Decision:
        # The proxy finishes every request it routes (forward.py's ``finally``): no TTL.
        decision = self.core.route(uuid.uuid4().hex, tokens, scores, policy=policy, expires=False)
        c = self.counters.worker(decision.worker_id)
        c.routed += 1
        c.estimated_tokens += decision.hit_tokens
        return decision

    def finish(self, decision: Decision) -> None:
        self.core.finish(decision.request_id)

    def worker_view(self, worker_id: str) -> dict[str, Any]:
        """One worker as the proxy sees it (``/v1/workers``, ``/v1/proxy/workers``)."""
        h = self.health.health(worker_id)
        c = self.counters.worker(worker_id)
        models = self.worker_models(worker_id)
        why = self.health.why_not_live(worker_id)
        return {
            "live": why is None,
            "why_not_live": why,
            "http_endpoint": self.service.worker_spec(worker_id).http_endpoint,
            "models": sorted(models) if models is not None else None,
            "http_ok": h.http_ok,
            "health_checks": h.checks,
            "failed_checks": h.failed_checks,
            "forward_failures": h.forward_failures,
            "inflight": self.core.inflight_by_worker().get(worker_id, 0),
            "routed": c.routed,
            "retried_away": c.retried_away,
            "upstream_errors": c.upstream_errors,
            "estimated_hit_tokens": c.estimated_tokens,
            "cached_tokens": c.cached_tokens,
            "estimates_compared": c.compared,
            "estimate_exact_share": self.counters.share(c.recent_exact),
        }

    def endpoint(self, worker_id: str) -> str:
        url = self.service.worker_spec(worker_id).http_endpoint
        assert url is not None  # candidates() only returns workers with one
        return url.rstrip("/")

    async def close(self) -> None:
        self.upstream.close()
        await self.client.aclose()
