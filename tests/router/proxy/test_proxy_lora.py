"""A LoRA adapter selected as vLLM selects it: by ``model``. vLLM lists an adapter as a
model card whose ``parent`` is the base model, and hashes an adapter request's blocks with
the adapter's name, so the same prompt under the base model and under the adapter share
no block. The proxy scored every request as the base model's (it read only the
``lora_name`` field, which vLLM does not take): its estimate for an adapter request was
the base model's cached prefix, a hit the engine did not have."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from _fleet import MODEL, RouterProc, fleet, shutdown, wait_caught_up

pytestmark = pytest.mark.timeout(300)

PROMPT = "kabe dodo fifu hali mopa suvo " * 12


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    r = fleet(tmp_path_factory.mktemp("lora"), 1, "--lora-modules", "ad1=/adapters/ad1")
    yield r
    shutdown(r)


def test_an_adapter_named_as_the_model_is_scored_as_the_adapter(router: RouterProc) -> None:
    engine = router.engines[0]
    with openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0) as client:
        cards = {m.id: m for m in client.models.list()}
        assert cards["ad1"].model_extra["parent"] == MODEL  # as vLLM lists an adapter

        def complete(model: str, tail: str) -> tuple[int, int]:
            r = client.completions.with_raw_response.create(
                model=model, prompt=PROMPT + tail, max_tokens=1
            )
            wait_caught_up(router, engine)
            cached = r.parse().usage.prompt_tokens_details.cached_tokens
            return int(r.headers["x-kvroute-hit-tokens"]), cached

        assert complete(MODEL, "lolo") == (0, 0)
        # The adapter's blocks hash apart from the base model's: nothing cached for it yet,
        # and the router must not count the base model's blocks.
        assert complete("ad1", "pela") == (0, 0)
        estimate, cached = complete("ad1", "nemu")
        assert cached > 0 and estimate == cached
