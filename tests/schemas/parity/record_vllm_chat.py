"""Record the prompt token ids vLLM 0.33's OpenAI server builds for chat requests, or its
refusal, so ``schemas.tokenization.ModelTokenizer.encode_chat`` can be held to them.

This is the driver; the request bodies are data beside it (``CASES`` in chat_cases.py,
built from chat_cases_tools.py, chat_cases_content.py and chat_case_parts.py). Each body
goes through vLLM's own code, as ``POST /v1/chat/completions`` does: the
``ChatCompletionRequest`` pydantic model (its validators), then
``OnlineRenderer.render_chat`` (tool-choice checks, ``tool_dicts`` from
``ChatCompletionToolsParam.model_dump()``, ``validate_chat_template``, ``preprocess_chat``
-> ``build_chat_params`` / ``ChatParams.with_defaults`` -> ``HfRenderer`` -> content
format detection -> message parsing -> ``safe_apply_chat_template`` -> transformers'
``apply_chat_template`` -> tokenization).
The tokenizers are kvroute-tiny (router/proxy/data/tiny) and three test directories in
tests/fixtures/vllm-chat/ with the same tokenizer.json: ``tools-tokenizer`` (a template
that renders tools, documents, thinking flags and every message field),
``named-tokenizer`` (chat_template.jinja plus a named "tool_use" template, using
transformers' template environment) and ``parts-tokenizer`` (a template that loops over
content parts, so vLLM passes them as a list, plus a "tool_use" one that takes strings).
It also records the content format vLLM's own detection (``_detect_content_format``, what
``--chat-template-content-format auto`` uses) gives each of ``FORMAT_TEMPLATES``.
Refusals are answered as the server answers them: a validation error by vLLM's
``validation_exception_handler``, an ``ErrorResponse`` as is, an exception through
``create_error_response`` (its exception handler).

The server is a plain ``vllm serve`` with ``--enable-auto-tool-choice
--tool-call-parser pythonic`` (so ``tool_choice`` "auto"/"required"/named are accepted;
without them vLLM refuses those before rendering, see docs/proxy.md) and the defaults
otherwise: no ``--trust-request-chat-template``, no
``--exclude-tools-when-tool-choice-none``, no ``--default-chat-template-kwargs``,
``--chat-template-content-format auto``. The model config is a stand-in
(``SimpleNamespace``) with the fields the render path reads: a real ``ModelConfig`` inspects
the model architecture, which imports vLLM's model code and dependencies the CPU-only
vLLM venv does not have.

Run in a venv with vLLM 0.33.0 (``make record-chat-parity``, or
``.venv-vllm/bin/python tests/schemas/parity/record_vllm_chat.py [--out PATH]``). Writes
tests/fixtures/vllm-chat/recording.json, or PATH (captured from vLLM 0.33.0's own code,
Apache-2.0). ``make test`` replays it without vLLM
(tests/schemas/test_chat_parity_vllm.py).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from chat_cases import CASES, TOKENIZERS
from chat_cases_content import FORMAT_TEMPLATES

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "vllm-chat" / "recording.json"
SERVER = {
    "enable_auto_tool_choice": True,
    "tool_call_parser": "pythonic",
    "trust_request_chat_template": False,
    "exclude_tools_when_tool_choice_none": False,
    "chat_template_content_format": "auto",
    "default_chat_template_kwargs": None,
}


def stand_in_configs(path: Path) -> tuple[Any, Any]:
    """The ``ModelConfig`` / ``VllmConfig`` fields the chat render path reads."""
    model_config = SimpleNamespace(
        model=str(path),
        tokenizer=str(path),
        hf_config=SimpleNamespace(model_type="llama"),
        max_model_len=131072,
        multimodal_config=None,
        enable_prompt_embeds=False,
        renderer_num_workers=1,
        revision=None,
        code_revision=None,
        tokenizer_revision=None,
        trust_remote_code=False,
        is_encoder_decoder=False,
        supports_multimodal_inputs=False,
        is_multimodal_model=False,
        encoder_config=None,
        allowed_local_media_path="",
        allowed_media_domains=None,
        get_vocab_size=lambda: 8192,
    )
    vllm_config = SimpleNamespace(
        model_config=model_config,
        parallel_config=SimpleNamespace(_api_process_rank=0),
        cache_config=SimpleNamespace(enable_prefix_caching=True),
        scheduler_config=None,
    )
    return model_config, vllm_config


class Server:
    """One tokenizer directory served the way ``vllm serve`` serves chat requests."""

    def __init__(self, path: Path) -> None:
        from vllm.renderers.hf import HfRenderer
        from vllm.renderers.online_renderer import OnlineRenderer
        from vllm.tokenizers import get_tokenizer

        model_config, vllm_config = stand_in_configs(path)
        renderer = HfRenderer(vllm_config, get_tokenizer(str(path)))
        self.online = OnlineRenderer(
            model_config,
            renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format=SERVER["chat_template_content_format"],
            trust_request_chat_template=SERVER["trust_request_chat_template"],
            enable_auto_tools=SERVER["enable_auto_tool_choice"],
            exclude_tools_when_tool_choice_none=SERVER["exclude_tools_when_tool_choice_none"],
            tool_parser=SERVER["tool_call_parser"],
            default_chat_template_kwargs=SERVER["default_chat_template_kwargs"],
        )

    async def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        from fastapi.exceptions import RequestValidationError
        from pydantic import ValidationError
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response,
        )
        from vllm.entrypoints.serve.exception_handling.handlers.validation import (
            validation_exception_handler,
        )

        try:
            request = ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            app = SimpleNamespace(state=SimpleNamespace(args=SimpleNamespace(log_error_stack=0)))
            response = await validation_exception_handler(
                SimpleNamespace(app=app),
                RequestValidationError(exc.errors()),
            )
            error = json.loads(response.body)["error"]
            return {"status": response.status_code, "message": error["message"]}
        except Exception as exc:  # a VLLMError from a validator is not wrapped by pydantic
            result: Any = create_error_response(exc)
        else:
            try:
                result = await self.online.render_chat(request)
            except Exception as exc:  # what the server's exception handlers answer
                result = create_error_response(exc)
        if isinstance(result, ErrorResponse):
            return {"status": result.error.code, "message": result.error.message}
        _conversation, (engine_input,) = result
        return {
            "status": 200,
            "prompt": engine_input.get("prompt"),
            "prompt_token_ids": list(engine_input["prompt_token_ids"]),
        }


def detect_format(template: str) -> str:
    """The content format vLLM detects for ``template`` (its cache is keyed by the text).
    Quiet: vLLM logs the traceback of a template it cannot parse or follow."""
    from vllm.renderers.hf import _detect_content_format

    level = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        return str(_detect_content_format(template, default="string"))
    finally:
        logging.disable(level)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the recording")
    out: Path = parser.parse_args(argv).out.resolve()

    import vllm

    logging.disable(logging.WARNING)
    servers = {name: Server(ROOT / rel) for name, rel in TOKENIZERS.items()}
    cases = []
    for c in CASES:
        body = copy.deepcopy(c["body"])  # vLLM's validators edit the body in place
        answer = asyncio.run(servers[c["tokenizer"]].answer(body))
        cases.append({**c, **answer})
        shown = answer.get("prompt") if answer["status"] == 200 else answer["message"]
        print(f"{c['name']:<58} {answer['status']} {str(shown)[:100]!r}", file=sys.stderr)
    formats = [
        {"name": name, "template": template, "format": detect_format(template)}
        for name, template in FORMAT_TEMPLATES.items()
    ]
    recording = {
        "vllm_version": vllm.__version__,
        "tokenizers": TOKENIZERS,
        "server": SERVER,
        "cases": cases,
        "content_formats": formats,
    }
    out.write_text(json.dumps(recording, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    refused = sum(c["status"] != 200 for c in cases)
    where = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"{len(cases)} cases ({refused} refused) -> {where}", file=sys.stderr)


if __name__ == "__main__":
    main()
