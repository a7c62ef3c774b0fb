"""``stop`` / ``stop_token_ids`` end a simulated answer where vLLM 0.33 ends it
(``v1/core/sched/utils.py`` ``check_stop``, ``v1/engine/detokenizer.py``
``check_stop_strings``): the answer keeps, counts and caches the tokens up to the one
that stopped it, and says why. The engine used to ignore both and always answer
``max_tokens`` tokens with ``finish_reason: "length"``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from _helpers import serve_in_thread

from offload_core.engine import EngineConfig, SimEngine
from offload_core.engine_app import DEFAULT_MODEL, create_app
from offload_core.engine_stop import StopRule, end_answer
from router.proxy.tiny_tokenizer import DEFAULT_DIR
from schemas.tokenization import ModelTokenizer

PROMPT = list(range(300, 309))  # 9 tokens
AS_IDS = {"logprobs": 0, "return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    engine = SimEngine(EngineConfig(worker_id="w0", groups="full:4", gpu_blocks=64, cpu_blocks=0))
    try:
        with serve_in_thread(create_app(engine, tokenizer=ModelTokenizer(DEFAULT_DIR))) as base:
            yield base
    finally:
        engine.shutdown()


def complete(url: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/v1/completions", json={"model": DEFAULT_MODEL, "max_tokens": 8, **body}, timeout=30
    )
    assert r.status_code == 200, r.text
    return r.json()


def answer_ids(out: dict[str, Any]) -> list[int]:
    return [int(t.split(":")[1]) for t in out["choices"][0]["logprobs"]["tokens"]]


def test_a_stop_token_ends_the_answer_counted_and_cached_but_not_in_its_text(url: str) -> None:
    full = complete(url, prompt=PROMPT, **AS_IDS)
    ids = answer_ids(full)
    assert full["choices"][0]["finish_reason"] == "length" and len(ids) == 8
    out = complete(url, prompt=PROMPT, stop_token_ids=[ids[4]], **AS_IDS)
    choice = out["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", ids[4])
    assert out["usage"]["completion_tokens"] == 5 and answer_ids(out) == ids[:5]
    plain = complete(url, prompt=PROMPT, stop_token_ids=[ids[4]])["choices"][0]["text"]
    text = complete(url, prompt=PROMPT)["choices"][0]["text"]
    assert text.startswith(plain) and len(plain.split()) == 4  # the stop token's text is out
    kept = complete(url, prompt=PROMPT, stop_token_ids=[ids[4]], include_stop_str_in_output=True)
    assert len(kept["choices"][0]["text"].split()) == 5


def test_a_stop_string_cuts_the_text_before_it(url: str) -> None:
    text = complete(url, prompt=PROMPT)["choices"][0]["text"]
    words = text.split()
    stop = words[3]
    assert stop not in " ".join(words[:3])  # the tiny vocabulary: no earlier match
    out = complete(url, prompt=PROMPT, stop=[stop, "never-generated"])
    choice = out["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    assert choice["text"] == text[: text.index(stop)]
    assert out["usage"]["completion_tokens"] == 4
    out = complete(url, prompt=PROMPT, stop=stop, include_stop_str_in_output=True)
    assert out["choices"][0]["text"] == text[: text.index(stop) + len(stop)]


def test_streamed_deltas_add_up_to_the_stopped_answer(url: str) -> None:
    text = complete(url, prompt=PROMPT)["choices"][0]["text"]
    stop = text.split()[2]
    body = {"model": DEFAULT_MODEL, "prompt": PROMPT, "max_tokens": 8, "stop": stop, "stream": True}
    deltas, finish = [], []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = httpx.Response(200, content=line[6:]).json()
                for c in chunk["choices"]:
                    deltas.append(c["text"])
                    finish.append((c["finish_reason"], c["stop_reason"]))
    assert "".join(deltas) == text[: text.index(stop)]
    assert finish[-1] == ("stop", stop) and all(f == (None, None) for f in finish[:-1])


def test_an_answer_stopped_early_caches_only_what_it_kept(url: str) -> None:
    prompt = list(range(400, 409))
    ids = answer_ids(complete(url, prompt=prompt, **AS_IDS))
    complete(url, prompt=prompt, max_tokens=8, stop_token_ids=[ids[1]], cache_salt="s")
    follow = complete(url, prompt=[*prompt, *ids, 5], cache_salt="s")
    # 9 prompt tokens + the 2 kept (the last never computed): 2 full blocks of 4, not 4.
    assert follow["usage"]["prompt_tokens_details"]["cached_tokens"] == 8


def test_vllm_refuses_an_empty_stop_string(url: str) -> None:
    r = httpx.post(
        f"{url}/v1/completions", json={"model": DEFAULT_MODEL, "prompt": PROMPT, "stop": [""]}
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "stop cannot contain an empty string."


def test_the_stop_string_completing_earliest_wins_across_tokens() -> None:
    rule = StopRule(("cd", "bcd e"), frozenset())
    # "ab" + "c" + "d" : "cd" completes at token 3 before "bcd e" could.
    end = end_answer([1, 2, 3, 4], ["ab", "c", "d", " e"], rule)
    assert end.tokens == [1, 2, 3] and end.texts == ["ab", "", ""]
    assert end.finish == {"finish_reason": "stop", "stop_reason": "cd"}
