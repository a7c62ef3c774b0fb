"""Many light engines in one process, for router benchmarks at fleet sizes where one
``kvroute engine`` process per worker does not fit the machine (each holds ~270 MB).

Each light engine has its own HTTP port and its own vLLM-wire KV event stream (a
``ZmqEventPublisher``: PUB + replay ROUTER), like a real engine:

* ``GET /health`` 200, ``GET /v1/models`` its model, ``GET /health_checks`` when each
  ``/health`` arrived (``time.monotonic()``, one clock for all engines of the process);
* ``POST /v1/completions`` (and ``/v1/chat/completions``, answered alike) with a token-id
  prompt: the prompt's full blocks (16 tokens,
  sha256 chain as vLLM) that this engine has not stored yet are published as one
  ``BlockStored``; the answer is a one-token completion whose
  ``usage.prompt_tokens_details.cached_tokens`` counts the leading blocks it already held
  (text prompts are answered without caching). ``"stream": true`` gets the same as two
  SSE events;
* ``POST /fault`` (tests): ``{"completions_status": 503}`` answers completions with that
  status (the blocks are still stored and published: a worker whose cache holds the
  prompt but whose HTTP fails), ``{"completions_delay_s": 5}`` answers them that late (a
  hung engine), ``{"health_status": 500}`` fails ``/health``,
  ``{"close_events": true}`` closes its KV event stream, ``{"require_key": "K"}`` answers
  401 on every path unless ``Authorization: Bearer K`` (an engine started with
  ``--api-key``), ``{"break_stream": true}`` ends a streamed completion after its first
  event by closing the connection (an engine dying mid-stream);
* ``POST /v1/embeddings``, ``/v1/rerank``, ``/rerank``: fixed answers in vLLM's shape;
* ``GET /last_request`` (tests): the headers of the last completion, embeddings or rerank
  request, as received.

Every answer carries ``date`` and ``server`` headers, as uvicorn's do.

No model, no scheduler: the point is a fleet that answers in tens of microseconds, so what
a benchmark measures is the router. Run: ``python benchmarks/light_engines.py --ports
HTTP,PUB,REPLAY [HTTP,PUB,REPLAY ...]`` (loopback only); it prints ``ready`` when all
are up and runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from publisher.zmq_publisher import ZmqEventPublisher
from schemas import BlockStored, KVEventBatch
from schemas.hashing import block_hashes, external_hash

BLOCK = 16
MODEL = "kvroute-sim"
_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()


class LightEngine:
    def __init__(self, worker_id: str, http: int, pub: int, replay: int) -> None:
        self.worker_id, self.http = worker_id, http
        self.publisher = ZmqEventPublisher(
            f"tcp://127.0.0.1:{pub}",
            f"tcp://127.0.0.1:{replay}",
            topic=f"kv@{worker_id}",
            mode="bind",
        )
        self.stored: dict[bytes, None] = {}  # insertion-ordered: evict the oldest
        self.capacity = 4096
        self.completions_status = 200
        self.health_status = 200
        self.completions_delay_s = 0.0
        self.health_checks: list[float] = []  # time.monotonic() of each GET /health
        self.require_key: bytes | None = None
        self.break_stream = False
        self.last_headers: dict[str, str] = {}

    def complete(self, body: dict) -> bytes:
        prompt = body.get("prompt")
        cached, n_prompt = 0, 0
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            n_prompt = len(prompt)
            digests = block_hashes(prompt, BLOCK)
            hit = 0
            while hit < len(digests) and digests[hit] in self.stored:
                hit += 1
            cached = hit * BLOCK
            new = digests[hit:]
            if new:
                parent = external_hash(digests[hit - 1]) if hit else None
                self.publisher.publish(
                    KVEventBatch(
                        ts=time.time(),
                        events=[
                            BlockStored(
                                block_hashes=[external_hash(d) for d in new],
                                parent_block_hash=parent,
                                token_ids=list(prompt[hit * BLOCK : len(digests) * BLOCK]),
                                block_size=BLOCK,
                                lora_id=None,
                                medium="GPU",
                                lora_name=None,
                            )
                        ],
                    )
                )
                for d in new:
                    self.stored[d] = None
                while len(self.stored) > self.capacity:
                    del self.stored[next(iter(self.stored))]
        usage = {
            "prompt_tokens": n_prompt,
            "completion_tokens": 1,
            "total_tokens": n_prompt + 1,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        return _encode.encode(
            {
                "id": f"cmpl-{self.worker_id}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": MODEL,
                "choices": [{"index": 0, "text": " x", "finish_reason": "length"}],
                "usage": usage,
            }
        )

    def fault(self, body: dict) -> bytes:
        self.completions_status = int(body.get("completions_status", self.completions_status))
        self.health_status = int(body.get("health_status", self.health_status))
        self.completions_delay_s = float(body.get("completions_delay_s", self.completions_delay_s))
        if body.get("close_events"):
            self.publisher.shutdown(0.2)
        if "require_key" in body:
            key = body["require_key"]
            self.require_key = b"Bearer " + key.encode() if key else None
        self.break_stream = bool(body.get("break_stream", self.break_stream))
        return b"{}"

    def authorized(self, headers: list[bytes]) -> bool:
        if self.require_key is None:
            return True
        return any(
            h[:14].lower() == b"authorization:" and h[14:].strip() == self.require_key
            for h in headers
        )

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *headers = head.split(b"\r\n")
                method, path, _ = line.split(b" ", 2)
                length = 0
                for h in headers:
                    if h[:15].lower() == b"content-length:":
                        length = int(h[15:])
                raw = await reader.readexactly(length) if length else b""
                ctype, status = b"application/json", 200
                broken = False
                if path != b"/fault" and not self.authorized(headers):
                    out, status = b'{"error": {"message": "Unauthorized"}}', 401
                elif path == b"/last_request":
                    out = _encode.encode(self.last_headers)
                elif path == b"/health":
                    self.health_checks.append(time.monotonic())
                    out, status = b"{}", self.health_status
                elif path == b"/health_checks":  # tests: when the router checked us
                    out = _encode.encode(self.health_checks)
                elif method == b"POST" and path == b"/fault":
                    out = self.fault(_decode.decode(raw))
                elif path == b"/v1/models":
                    card: dict[str, object] = {"id": MODEL, "object": "model"}
                    card.update(owned_by="vllm", root=MODEL, max_model_len=4096)
                    out = _encode.encode({"object": "list", "data": [card]})
                elif method == b"POST" and path in (b"/v1/embeddings", b"/v1/rerank", b"/rerank"):
                    self.last_headers = self.headers_of(headers)
                    out = self.pooled(path, _decode.decode(raw))
                elif method == b"POST" and path in (b"/v1/completions", b"/v1/chat/completions"):
                    self.last_headers = self.headers_of(headers)
                    body = _decode.decode(raw)
                    out = self.complete(body)
                    status = self.completions_status
                    if self.completions_delay_s:
                        await asyncio.sleep(self.completions_delay_s)
                    if status != 200:
                        out = b'{"error": {"code": "fault", "message": "injected"}}'
                    elif body.get("stream") is True:
                        ctype = b"text/event-stream"
                        out = b"data: " + out + b"\n\ndata: [DONE]\n\n"
                        broken = self.break_stream
                else:
                    out, status = b'{"error": "not found"}', 404
                if broken:  # the first event, then the connection drops mid-body
                    event = out[: out.index(b"\n\n") + 2]
                    writer.write(self.head(status, ctype, len(out)) + event)
                    await writer.drain()
                    return
                writer.write(self.head(status, ctype, len(out)) + out)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    @staticmethod
    def headers_of(headers: list[bytes]) -> dict[str, str]:
        return {
            k.decode().lower(): v.decode().strip()
            for k, _, v in (h.partition(b":") for h in headers if h)
        }

    @staticmethod
    def pooled(path: bytes, body: dict) -> bytes:
        """An embeddings or rerank answer in vLLM's shape (fixed numbers: no model)."""
        usage = {"prompt_tokens": 1, "total_tokens": 1}
        if path == b"/v1/embeddings":
            data = [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}]
            return _encode.encode({"object": "list", "data": data, "model": MODEL, "usage": usage})
        docs = body.get("documents") or []
        results = [{"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(len(docs))]
        return _encode.encode({"id": "rerank-light", "model": MODEL, "results": results})

    @staticmethod
    def head(status: int, ctype: bytes, length: int) -> bytes:
        date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()).encode()
        return (
            b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
            % (
                status,
                ctype,
                length,
            )
            + b"date: %s\r\nserver: light-engine\r\n\r\n" % date
        )


async def run(ports: list[tuple[int, int, int]]) -> None:
    engines = [LightEngine(f"l{i}", *p) for i, p in enumerate(ports)]
    servers = [await asyncio.start_server(e.handle, "127.0.0.1", e.http) for e in engines]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for s in servers:
        s.close()
    for e in engines:
        e.publisher.shutdown(0.2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ports", nargs="+", required=True, help="HTTP,PUB,REPLAY per engine")
    args = p.parse_args()
    ports = [tuple(int(x) for x in s.split(",")) for s in args.ports]
    asyncio.run(run(ports))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
