"""``POST /v1/completions`` and ``/v1/chat/completions``: route, forward, stream back.

Pure ASGI (no per-request Request/Response objects) because this is the hot path: the
router's added latency is what users compare with the Rust routers. The engine's status,
headers and body pass through unchanged, plus ``x-kvroute-worker`` and
``x-kvroute-hit-tokens``. An attempt that fails before the engine's first byte (connect
error, timeout, 5xx) is retried on the next-best worker, up to ``proxy_retries`` times;
a client that goes away cancels the upstream request (its connection is closed). The
in-flight count is released however the response ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.proxy.core import Proxy, ProxyError
from router.proxy.headers import forwarded
from router.proxy.upstream import DROP, UpstreamError, UpstreamResponse
from router.proxy.usage import cached_tokens_of, cached_tokens_of_stream
from router.proxy.warming import send_warming
from router.routing.policy import check_policy
from router.routing.state import Decision
from router.service import UnknownWorker
from schemas.rest import error_body
from schemas.tokenization import TokenizationError

log = logging.getLogger(__name__)

PATHS = {b"/v1/completions": False, b"/v1/chat/completions": True}
_PATHS_STR = {p.decode(): chat for p, chat in PATHS.items()}
_RATE_S = 10.0


_body_decoder = msgspec.json.Decoder()


def _json_error(status: int, code: str, message: str) -> tuple[int, bytes]:
    return status, msgspec.json.encode(error_body(status, code, message))


async def _send_json(send: Send, status: int, body: bytes, extra: list | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": body})


class _Reply:
    """The client's ``send``, noting whether the response started and ended."""

    __slots__ = ("_send", "finished", "started")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.finished = False

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.started = True
        elif kind == "http.response.body" and not message.get("more_body"):
            self.finished = True
        await self._send(message)


class _ClientGone(Exception):
    """The client disconnected before its request body arrived: nothing to answer."""


class _Failed(Exception):
    """An attempt failed before any byte reached the client: try the next worker."""

    def __init__(self, reason: str, connect: bool) -> None:
        super().__init__(reason)
        self.connect = connect


class ProxyMiddleware:
    """Answers the two proxied POST paths; everything else goes to the wrapped app."""

    def __init__(self, app: ASGIApp, proxy: Proxy) -> None:
        self.app = app
        self.proxy = proxy
        self.max_body = proxy.settings.max_request_tokens * 12 + (1 << 20)
        self._last_log = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chat = _PATHS_STR.get(scope["path"])
        if chat is None:
            await self.app(scope, receive, send)
            return
        endpoint = "chat" if chat else "completions"
        outcome = "error"
        reply = _Reply(send)
        try:
            outcome = await self._handle(scope, receive, reply, chat)
        except ProxyError as exc:
            outcome = exc.code
            await _send_json(reply.send, *_json_error(exc.status, exc.code, exc.message))
        except _ClientGone:
            outcome = "client_cancelled"
        except Exception as exc:  # a bug: answer JSON 500 if we still can, never crash
            outcome = "internal_error"
            self._log(f"internal error: {exc!r}", exc_info=True)
            if not reply.started:
                await _send_json(send, *_json_error(500, "internal_error", "internal error"))
        finally:
            self.proxy.counters.requests[endpoint, outcome] += 1

    # ------------------------------------------------------------------ request
    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                raise ProxyError(413, "payload_too_large", f"body exceeds {self.max_body} bytes")
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise ProxyError(413, "payload_too_large", f"body exceeds {self.max_body} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def _check_key(self, scope: Scope) -> None:
        """Completions add load (in-flight accounting), like ``/v1/route``: the key is
        needed whenever one is set (docs/security.md)."""
        s = self.proxy.settings
        if not s.api_key:
            return
        got = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    got = token.strip()
            elif name == b"x-api-key" and got is None:
                got = value.decode("latin-1")
        if got is None or not hmac.compare_digest(got.encode(), s.api_key.encode()):
            raise ProxyError(401, "unauthorized", "send 'Authorization: Bearer KEY'")

    async def _handle(self, scope: Scope, receive: Receive, reply: _Reply, chat: bool) -> str:
        self._check_key(scope)
        raw = await self._read_body(scope, receive)
        try:
            body = _body_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise ProxyError(
                400, "invalid_json", f"request body is not valid JSON: {exc}"
            ) from None
        except UnicodeError:  # msgspec raises it for invalid UTF-8 inside a string
            raise ProxyError(400, "invalid_json", "request body is not valid UTF-8") from None
        except RecursionError:
            raise ProxyError(400, "invalid_json", "request body is nested too deeply") from None
        if not isinstance(body, dict):
            raise ProxyError(400, "invalid_request", "request body must be a JSON object")
        model = self.proxy.requested_model(body)
        policy = None
        for name, value in scope["headers"]:
            if name == b"x-kvroute-policy":
                try:
                    policy = check_policy(value.decode("latin-1"))
                except ValueError as exc:
                    raise ProxyError(400, "unknown_policy", str(exc)) from None
        # With a router key the client's Authorization (and X-API-Key) is that key: it
        # stays here (the engines get engine_api_key, when set, from the upstream pool).
        forward_headers = forwarded(scope["headers"], bool(self.proxy.settings.api_key))
        forward_headers.append((b"content-type", b"application/json"))
        stream = body.get("stream") is True
        p = self.proxy
        workers = p.candidates(model)
        try:
            tokens = p.tokens(body, chat)
        except TokenizationError as exc:
            raise ProxyError(400, "invalid_request", str(exc)) from None
        if len(tokens) > p.settings.max_request_tokens:
            raise ProxyError(
                413, "prompt_too_long", f"{len(tokens)} prompt tokens exceed the limit"
            )
        scores = await p.scores(tokens, workers, body)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        want_usage = (
            stream
            and isinstance(body.get("stream_options"), dict)
            and bool(body["stream_options"].get("include_usage"))
        )
        # The forward runs in this task; a watcher cancels it if the client goes away
        # (closing the upstream response cancels the request at the engine). One task
        # per request rather than two plus asyncio.wait: this is the per-request path.
        task = asyncio.current_task()
        assert task is not None
        state = [True, False]  # [watching, client gone]

        def on_disconnect(_: asyncio.Task[None]) -> None:
            if state[0] and not reply.finished:
                state[1] = True
                task.cancel()

        watch = asyncio.create_task(_disconnected(receive))
        watch.add_done_callback(on_disconnect)
        try:
            return await self._forward(
                reply.send, path, raw, body, forward_headers, tokens, scores, policy, stream,
                want_usage,
            )  # fmt: skip
        except asyncio.CancelledError:
            if not state[1]:
                raise
            task.uncancel()
            return "client_cancelled"
        except OSError:  # uvicorn's ClientDisconnected from a send
            return "client_cancelled"
        finally:
            state[0] = False
            watch.remove_done_callback(on_disconnect)
            watch.cancel()

    # ------------------------------------------------------------------ forward
    async def _forward(
        self,
        send: Send,
        path: str,
        raw: bytes,
        body: dict,
        headers: list[tuple[bytes, bytes]],
        tokens: list[int],
        scores: list,
        policy: str | None,
        stream: bool,
        want_usage: bool,
    ) -> str:
        p = self.proxy
        attempts = p.settings.proxy_retries + 1
        last = "no attempt"
        while scores and attempts > 0:
            attempts -= 1
            decision = p.route(tokens, scores, policy)
            worker = decision.worker_id
            try:
                base = p.endpoint(worker)
                if decision.warm:
                    await self._warm(base, body, tokens, decision, headers)
                return await self._attempt(
                    send, base + path, raw, headers, decision, stream, want_usage
                )
            except (_Failed, UnknownWorker) as exc:
                last = f"{worker}: {exc}"
                c = p.counters.worker(worker)
                c.upstream_errors += 1
                scores = [s for s in scores if s.worker_id != worker]
                c.retried_away += attempts > 0 and bool(scores)  # a retry really follows
                if isinstance(exc, _Failed) and exc.connect:
                    p.health.forward_failed(worker, str(exc))
                self._log(f"attempt on {worker} failed before the first byte: {exc}")
            finally:
                p.finish(decision)
        status, error = _json_error(502, "upstream_failed", f"every attempt failed; last: {last}")
        await _send_json(send, status, error)
        return "upstream_failed"

    async def _warm(
        self,
        base: str,
        body: dict,
        tokens: list[int],
        decision: Decision,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """Prefix warming before the request (``router.proxy.warming``); best effort."""
        p = self.proxy
        plain = [h for h in headers if h[0] in (b"content-type", b"authorization")]
        sent, how = await send_warming(
            p.upstream, base + "/v1/completions", body, tokens, decision.warm, plain
        )
        p.counters.warmed(sent, how)

    async def _attempt(
        self,
        send: Send,
        url: str,
        raw: bytes,
        headers: list[tuple[bytes, bytes]],
        decision: Decision,
        stream: bool,
        want_usage: bool,
    ) -> str:
        try:
            response = await self.proxy.upstream.post(url, raw, headers)
        except UpstreamError as exc:  # connect error, timeout, reset before the head
            raise _Failed(str(exc), connect=True) from None
        try:
            if response.status >= 500:
                with contextlib.suppress(UpstreamError):
                    await response.read()
                raise _Failed(f"HTTP {response.status}", connect=False)
            out_headers = [(k, v) for k, v in response.headers if k.lower() not in DROP]
            out_headers.append((b"x-kvroute-worker", decision.worker_id.encode()))
            out_headers.append((b"x-kvroute-hit-tokens", b"%d" % decision.hit_tokens))
            out_headers.append((b"x-kvroute-request-id", decision.request_id.encode()))
            ctype = response.header(b"content-type") or b""
            if not (stream and ctype.startswith(b"text/event-stream")):
                try:
                    body = await response.read()
                except UpstreamError as exc:  # nothing sent yet: still retryable
                    raise _Failed(str(exc), connect=True) from None
                out_headers.append((b"content-length", b"%d" % len(body)))
                start = {"type": "http.response.start", "status": response.status}
                await send({**start, "headers": out_headers})
                await send({"type": "http.response.body", "body": body})
                if response.status == 200:
                    self._observe(decision, cached_tokens_of(body))
                return "ok" if response.status < 400 else f"http_{response.status}"
            return await self._stream(send, response, out_headers, decision, want_usage)
        finally:
            response.close()

    async def _stream(
        self,
        send: Send,
        response: UpstreamResponse,
        headers: list[tuple[bytes, bytes]],
        decision: Decision,
        want_usage: bool,
    ) -> str:
        chunks = response.chunks()
        try:  # the first chunk before our head: a failure here is still retryable
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = b""
        except UpstreamError as exc:
            raise _Failed(str(exc), connect=True) from None
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        tail = first if want_usage else b""
        await send({"type": "http.response.body", "body": first, "more_body": True})
        outcome = "ok"
        try:
            async for chunk in chunks:
                if want_usage:
                    tail = (tail + chunk)[-65536:]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as exc:  # the engine died mid-stream: tell the client in-band
            outcome = "upstream_broken"
            self.proxy.counters.worker(decision.worker_id).upstream_errors += 1
            err = msgspec.json.encode(error_body(502, "upstream_failed", f"stream broken: {exc}"))
            # As vLLM ends a stream that failed: the error event, then [DONE], so a client
            # reading to [DONE] stops.
            event = b"data: " + err + b"\n\ndata: [DONE]\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        if want_usage:
            self._observe(decision, cached_tokens_of_stream(tail))
        return outcome

    def _observe(self, decision: Decision, cached: int | None) -> None:
        if cached is not None:
            self.proxy.counters.observe_cached(decision.worker_id, decision.hit_tokens, cached)
            self.proxy.core.observe_cached(decision.hit_tokens, cached)
        self.proxy.service.recent_routes.append(
            {
                "ts": time.time(),
                "request_id": decision.request_id,
                "worker_id": decision.worker_id,
                "hit_tokens": decision.hit_tokens,
                "request_tokens": decision.request_tokens,
                "policy": decision.policy,
                "cached_tokens": cached,
            }
        )

    def _log(self, message: str, exc_info: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_log >= _RATE_S:
            self._last_log = now
            log.warning("proxy: %s", message, exc_info=exc_info)


async def _disconnected(receive: Callable[[], Awaitable[Message]]) -> None:
    """Returns when the client disconnects (or, after the response, when uvicorn says so)."""
    while (await receive())["type"] != "http.disconnect":
        pass
