"""HTTP face of the simulated engine: vLLM's OpenAI API over ``SimEngine``.

``/v1/completions`` and ``/v1/chat/completions`` (streaming, ``n``, echo, logprobs, usage with
``prompt_tokens_details.cached_tokens``), ``/v1/models``, ``/tokenize``, ``/detokenize``,
``/version``, vLLM's ``/metrics``;
text and chat need ``--tokenizer`` (the same tokenizer code the router's proxy uses).

Requests run one at a time (an asyncio lock) in a worker thread, so the event order is
exact and the event loop stays free for ``/health`` while torch copies run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import zmq
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from offload_core.engine import EngineConfig, SimEngine
from offload_core.engine_context import DEFAULT_MAX_MODEL_LEN, check_output_limit, output_budget
from offload_core.engine_errors import Reject, error_response, install_error_handlers
from offload_core.engine_metrics import VllmMetrics
from offload_core.engine_openai import (
    Builder,
    ChatRequest,
    CompletionRequest,
    Step,
    check_ids,
    output_ids,
    prompts_of,
    refusal,
    usage_of,
)
from offload_core.engine_stop import LENGTH, StopRule, end_answer
from offload_core.groups import format_groups
from offload_core.kv_cache import RequestTooLargeError
from publisher import EventPublisher, KVEventsConfig, PublishMode, make_publisher

log = logging.getLogger("kvroute.engine")

DEFAULT_MODEL = "kvroute-sim"
VLLM_VERSION = "0.33.0"  # the vLLM whose OpenAI server this one answers like (/version)


def create_app(
    engine: SimEngine,
    *,
    tokenizer: Any = None,
    model: str = DEFAULT_MODEL,
    strict_model: bool = False,
    token_delay_s: float = 0.0,
    prefill_s_per_token: float = 0.0,
    lora_modules: Sequence[str] = (),
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> FastAPI:
    """``tokenizer``: a ``schemas.tokenization.ModelTokenizer`` for text prompts and
    chat; ``token_delay_s``: the simulated time per generated token (streams pace by it);
    ``prefill_s_per_token``: simulated prefill time per *uncached* prompt token, one
    prefill at a time (so a cache hit and a short queue show in the time to first token);
    ``max_model_len``: the context, listed and enforced as vLLM does (``engine_context``)."""
    lock = asyncio.Lock()
    wid = engine.config.worker_id
    http_stats = {"streams": 0, "streams_completed": 0, "streams_cancelled": 0}
    # For /metrics: requests queued for a prefill, prefilling or streaming, and totals.
    load = {"waiting": 0, "running": 0, "tokens": 0, "finished": 0}
    vocab = tokenizer.tokenizer.get_vocab_size() if tokenizer is not None else 32_000

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log.info("worker %s: HTTP up", wid)
        yield
        log.info("worker %s: HTTP stopping", wid)

    app = FastAPI(title=f"kvroute engine {wid}", lifespan=lifespan)

    install_error_handlers(app)

    @app.get("/health")
    @app.get("/healthz")
    async def health() -> dict[str, str]:
        return {"status": "ok", "worker_id": wid}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        async with lock:  # the engine's dicts change while a request runs in its thread
            return {**engine.stats_dict(), **http_stats}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VLLM_VERSION}

    @app.get("/metrics")
    async def metrics() -> Response:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(VllmMetrics(engine, model, load))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model, "object": "model", "created": 0, "owned_by": "kvroute", "root": model}
        # As vLLM lists a LoRA adapter: its own card, the base model as ``parent``, and
        # the context on the base model's card only.
        adapters = [{**card, "id": n, "root": f"lora://{n}", "parent": model} for n in lora_modules]
        return {"object": "list", "data": [{**card, "max_model_len": max_model_len}, *adapters]}

    def need_tokenizer(what: str) -> Any:
        if tokenizer is None:
            raise Reject(f"{what} needs a tokenizer (--tokenizer PATH)")
        return tokenizer

    def check_model(name: str | None) -> None:
        # vLLM: an empty name is the base model; an adapter's name selects the adapter.
        if strict_model and name and name != model and name not in lora_modules:
            raise Reject(
                f"The model `{name}` does not exist. Valid aliases: {model}.",
                404,
                "NotFoundError",
                "model",
            )

    def check(body: CompletionRequest | ChatRequest) -> None:
        check_model(body.model)
        message = refusal(body, vocab)
        if message is not None:
            raise Reject(message)
        check_output_limit(body, max_model_len)

    def to_ids(prompt: list[int] | str, add_special_tokens: bool) -> list[int]:
        if isinstance(prompt, str):
            return need_tokenizer("a text prompt").encode(prompt, add_special_tokens)
        try:
            check_ids(prompt)
        except ValueError as exc:
            raise Reject(str(exc)) from None
        return prompt

    async def prefill(ids: list[int], body: Any, output: list[int]) -> Any:
        load["waiting"] += 1
        try:
            await lock.acquire()
        finally:
            load["waiting"] -= 1
        load["running"] += 1
        try:
            # The answer's tokens are decoded into the cache, as vLLM caches a request's
            # full blocks of generated tokens (a later turn that sends them back hits).
            # vLLM selects a LoRA adapter by ``model``; ``lora_name`` is this engine's own.
            lora = body.model if body.model in lora_modules else body.lora_name
            args = (ids, body.cache_salt, lora, max(len(output), 1), output)
            run = await asyncio.to_thread(engine.serve, *args)
            if prefill_s_per_token > 0:
                await asyncio.sleep((run.prompt_tokens - run.cached_tokens) * prefill_s_per_token)
            return run
        except RequestTooLargeError as exc:
            raise Reject(str(exc)) from None
        finally:
            load["running"] -= 1
            lock.release()

    async def run(chat: bool, body: Any, prompts: list[tuple[list[int], str | None]]) -> Any:
        budgets = [output_budget(body, len(ids), max_model_len) for ids, _ in prompts]
        outputs = [
            [output_ids([*ids, c], budget, vocab) for c in range(body.n)]
            for (ids, _), budget in zip(prompts, budgets, strict=True)
        ]
        build = Builder.of(body, body.model or model, tokenizer, vocab)
        rule = StopRule.of(body)  # an answer a stop rule ends keeps (and caches) less
        endings = [[end_answer(gen, build.texts(gen), rule) for gen in out] for out in outputs]
        # As vLLM runs n > 1 (one child request per choice, each decoding its own answer
        # into the cache); the usage is the first child's, the prompt counted once.
        results = []
        for (ids, _), ends in zip(prompts, endings, strict=True):
            results.append(await prefill(ids, body, ends[0].tokens))
            for answer in ends[1:]:
                await prefill(ids, body, answer.tokens)
        choices: list[list[Step]] = []
        for (ids, text), ends in zip(prompts, endings, strict=True):
            echo = None
            if not chat and body.echo:
                echo = (
                    text if text is not None else tokenizer.decode(ids) if tokenizer else "",
                    ids,
                )
            for answer in ends:
                if answer.finish is not LENGTH:
                    build.ends[len(choices)] = answer.finish
                choices.append(build.steps(answer.tokens, echo, answer.texts))
        completion_tokens = sum(s.tokens for steps in choices for s in steps)
        cached = sum(r.cached_tokens for r in results)
        usage = usage_of(sum(r.prompt_tokens for r in results), completion_tokens, cached)
        load["tokens"] += completion_tokens
        if not body.stream:
            load["finished"] += len(choices)
            kv = {
                "worker_id": wid,
                "gpu_cached_tokens": sum(r.gpu_cached_tokens for r in results),
                "loaded_blocks": sum(r.loaded_blocks for r in results),
                "offloaded_blocks": sum(r.offloaded_blocks for r in results),
                "computed_blocks": sum(r.computed_blocks for r in results),
            }
            return JSONResponse(build.response(choices, usage, kv))
        prompt_tokens = [len(ids) for ids, _ in prompts for _ in range(body.n)]
        frames_of = build.stream_chunks(
            choices, prompt_tokens, usage if body.include_usage else None, body.continuous_usage
        )

        async def frames() -> AsyncIterator[bytes]:
            http_stats["streams"] += 1
            load["running"] += 1
            completed = False
            try:
                for frame in frames_of:
                    if frame is None:
                        if token_delay_s > 0:
                            await asyncio.sleep(token_delay_s)
                        continue
                    yield frame
                completed = True
            finally:
                load["running"] -= 1
                load["finished"] += len(choices) if completed else 0
                http_stats["streams_completed" if completed else "streams_cancelled"] += 1

        return StreamingResponse(frames(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Any:
        check(body)
        prompts = [
            (to_ids(p, body.add_special_tokens), p if isinstance(p, str) else None)
            for p in prompts_of(body)
        ]
        return await run(False, body, prompts)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest) -> Any:
        check(body)
        tok = need_tokenizer("chat")
        try:
            ids = tok.encode_chat(body.model_dump())
        except ValueError as exc:  # TokenizationError: bad messages or template failure
            raise Reject(str(exc)) from None
        return await run(True, body, [(ids, None)])

    @app.post("/tokenize")
    async def tokenize(body: dict[str, Any]) -> dict[str, Any]:
        check_model(body.get("model"))
        tok = need_tokenizer("tokenize")
        try:
            if "messages" in body:
                ids = tok.encode_chat(body)
            elif isinstance(body.get("prompt"), str):
                ids = tok.encode(body["prompt"], bool(body.get("add_special_tokens", True)))
            else:
                raise Reject("send 'prompt' (text) or 'messages'")
        except ValueError as exc:
            raise Reject(str(exc)) from None
        strs = None
        if body.get("return_token_strs"):
            strs = [tok.tokenizer.id_to_token(t) for t in ids]
        limit = max_model_len
        return {"count": len(ids), "max_model_len": limit, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(body: dict[str, Any]) -> dict[str, Any]:
        check_model(body.get("model"))
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise Reject("'tokens' must be a list of token ids")
        # vLLM answers 400 for an id that is negative or does not fit the tokenizer's u32
        # (DetokenizeRequest's bounds, then OverflowError, both 400); an id past the
        # vocabulary but within u32 decodes to nothing there, so it does here too.
        bad = next((t for t in tokens if not 0 <= t < 1 << 32), None)
        if bad is not None:
            raise Reject(f"Token id {bad} is out of vocabulary")
        return {"prompt": need_tokenizer("detokenize").decode(tokens)}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        async with lock:
            ok = await asyncio.to_thread(engine.reset_prefix_cache)
        if not ok:
            return error_response(409, "blocks are in use; try again")
        return JSONResponse({"reset": True})

    return app


def engine_publisher(
    endpoint: str | None, replay: str | None, topic: str, mode: PublishMode = "bind"
) -> EventPublisher:
    """The engine's publisher: ZMQ with replay, or nothing when ``endpoint`` is empty."""
    config = KVEventsConfig(
        enable_kv_cache_events=bool(endpoint),
        endpoint=endpoint or "tcp://127.0.0.1:5557",
        replay_endpoint=replay or None,
        topic=topic,
        publish_mode=mode,
    )
    return make_publisher(config)


def run_server(
    config: EngineConfig,
    host: str,
    port: int,
    publish: str | None,
    replay: str | None,
    topic: str,
    *,
    tokenizer: str | None = None,
    model: str | None = None,
    token_delay_s: float = 0.0,
    publish_mode: PublishMode = "bind",
    prefill_s_per_token: float = 0.0,
    lora_modules: Sequence[str] = (),
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> int:
    """Run ``kvroute engine`` until interrupted."""
    import uvicorn

    tok = None
    if tokenizer:
        from schemas.tokenization import ModelTokenizer

        try:
            tok = ModelTokenizer(tokenizer)
        except Exception as exc:  # missing file, bad JSON: a clear start-up error
            log.error("worker %s: cannot load tokenizer %s: %s", config.worker_id, tokenizer, exc)
            return 2

    try:
        publisher = engine_publisher(publish, replay, topic, publish_mode)
    except (zmq.ZMQError, ValueError) as exc:
        log.error("worker %s: cannot open %s / %s: %s", config.worker_id, publish, replay, exc)
        return 1
    engine = SimEngine(config, publisher)
    endpoints = getattr(publisher, "bound_endpoint", None)
    log.info(
        "worker %s: groups %s, %d GPU blocks, %d CPU blocks (%s), device %s, "
        "publishing on %s (replay %s, topic %r), HTTP on http://%s:%d",
        config.worker_id,
        format_groups(engine.groups),
        config.gpu_blocks,
        config.cpu_blocks,
        config.cpu_policy,
        engine.buffers.device,
        endpoints or "nothing",
        getattr(publisher, "bound_replay_endpoint", None),
        topic,
        host,
        port,
    )
    try:
        app = create_app(
            engine,
            tokenizer=tok,
            model=model or DEFAULT_MODEL,
            strict_model=model is not None,  # like vLLM: 404 for another model's name
            token_delay_s=token_delay_s,
            prefill_s_per_token=prefill_s_per_token,
            lora_modules=lora_modules,
            max_model_len=max_model_len,
        )
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        engine.shutdown()
        log.info("worker %s: stopped", config.worker_id)
    return 0
