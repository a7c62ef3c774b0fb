"""The jinja2 environment transformers renders chat templates in, rebuilt without
transformers: the sandbox, its filters and globals. Apart because it is transformers'
behaviour, not vLLM's, and jinja2 is only imported when a template is first compiled."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from schemas.tokenization.errors import TokenizationError


def _raise_exception(message: str) -> None:
    raise TokenizationError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Not jinja2's own filter, which escapes HTML characters: transformers' defaults.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """``dict`` as transformers gives templates: callable, with ``fromkeys``, nothing more."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _jinja_env() -> Any:
    """The environment transformers renders chat templates in: jinja2's immutable sandbox
    with ``trim_blocks``/``lstrip_blocks``, ``break``/``continue``, the
    ``{% generation %}`` block (it marks the assistant's tokens for training masks and
    renders its body unchanged), a ``tojson`` that keeps non-ASCII text and takes
    ``indent``/``separators``/``sort_keys``, ``raise_exception``, ``strftime_now``, and
    ``dict``/``namespace`` that refuse what transformers refuses. (jinja2 is imported
    here, on first use, not with this module.)"""
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    class GenerationBlock(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            block = nodes.CallBlock(self.call_method("_body"), [], [], body)
            return block.set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a namespace attribute may not start with '_': {name!r}")

    class TemplateNamespace(Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            attrs = dict(*args[1:], **kwargs)
            for name in attrs:
                check_name(name)
            Namespace.__init__(args[0], attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check_name(name)
            Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env
