"""Finding and reading a tokenizer directory from disk: the path (local or the HF
cache, never downloaded), ``tokenizer_config.json`` and the chat templates, chosen as
transformers loads them. Apart from ``ModelTokenizer`` so file layout rules stay out of
the rendering code."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def resolve_tokenizer_path(name: str) -> Path:
    """A local directory/file, or a Hugging Face id already in the local cache (never
    downloaded); ``FileNotFoundError`` when neither exists."""
    path = Path(name).expanduser()
    if path.is_file():
        return path.parent if path.name == "tokenizer.json" else path
    if (path / "tokenizer.json").is_file():
        return path
    hub = Path(
        os.environ.get("HF_HUB_CACHE")
        or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub"
    )
    snapshots = hub / ("models--" + name.replace("/", "--")) / "snapshots"
    if snapshots.is_dir():
        found = sorted(
            (p for p in snapshots.iterdir() if (p / "tokenizer.json").is_file()),
            key=lambda p: p.stat().st_mtime,
        )
        if found:
            return found[-1]
    raise FileNotFoundError(f"no tokenizer.json at {name!r} nor in the local HF cache ({hub})")


def read_config(path: Path) -> dict[str, Any]:
    """``tokenizer_config.json`` in ``path`` ({} without one): special tokens, a template."""
    cfg_file = path / "tokenizer_config.json"
    config: dict[str, Any] = (
        json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
    )
    return config


def read_chat_templates(path: Path, config: Mapping[str, Any]) -> tuple[dict[str, str], str | None]:
    """(the named templates when there are several or none is "default", else {}; the
    default template or None). As transformers loads them: chat_template.jinja (the
    default) and additional_chat_templates/*.jinja (named) win over
    tokenizer_config.json's "chat_template", a string or a list of named templates."""
    named: dict[str, str] = {}
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        named["default"] = jinja_file.read_text(encoding="utf-8")
    extra_dir = path / "additional_chat_templates"
    if extra_dir.is_dir():
        for file in sorted(extra_dir.glob("*.jinja")):
            named[file.stem] = file.read_text(encoding="utf-8")
    if not named:
        template = config.get("chat_template")
        if isinstance(template, str):
            named["default"] = template
        elif isinstance(template, list):
            named = {
                t["name"]: t["template"]
                for t in template
                if isinstance(t, dict)
                and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str)
            }
    chat_templates = named if len(named) > 1 or "default" not in named else {}
    return chat_templates, named.get("default")
