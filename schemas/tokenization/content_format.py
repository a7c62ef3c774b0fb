"""Whether a chat template reads a message's content as a string or as a list of
OpenAI-style parts, decided from the template's syntax tree the way vLLM 0.33 decides it
(``--chat-template-content-format auto``, the server default). The answer changes the
conversation vLLM hands the template (``messages``), so the router must reach the same
one; apart from ``tokenizer`` because it is a static analysis, not a render.

The rule: the format is "openai" when the template has a ``for`` loop over a message's
``content``, where a message is the target of a loop over ``messages`` or over a name
bound to it; otherwise "string". The details that decide real templates:

- "bound to it": ``{% set x = ... %}`` whose value is the name (itself, filtered, tested
  or sliced), followed transitively, including namespace attributes (``namespace(a=...)``
  and ``{% set ns.a = ... %}``, read back as ``ns.a``);
- "a message's content": ``m['content']`` or ``m.content``, also filtered, tested or sliced;
- a loop inside a macro counts when it iterates a macro parameter that some call passes a
  message's content to (by position or by keyword); a loop outside every macro counts
  when it iterates a plain name ``content``, whatever that name holds;
- a template that does not parse, and a qualifying loop (over messages, or the first one
  over content) whose target is not a single name, give "string".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

ContentFormat = Literal["string", "openai"]
FORMATS: tuple[ContentFormat, ...] = ("string", "openai")


class _Unsupported(Exception):
    """A loop the analysis cannot follow: the template is taken as a string template."""


def _names(node: Any, name: str) -> bool:
    """``node`` reads the variable ``name`` (a dotted ``ns.attr`` reads an attribute)."""
    from jinja2 import nodes

    if isinstance(node, nodes.Name):
        return bool(node.ctx == "load" and node.name == name)
    if isinstance(node, nodes.Getattr) and "." in name:
        base, _, attr = name.rpartition(".")
        return bool(node.attr == attr) and _names(node.node, base)
    return False


def _reads(node: Any, name: str, key: str | None = None) -> bool:
    """``node`` is ``name`` (or its item ``key``: ``name[key]`` / ``name.key``), possibly
    behind filters, tests and slices."""
    from jinja2 import nodes

    if isinstance(node, nodes.Filter):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Test):
        return _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    if not key:
        return _names(node, name)
    if isinstance(node, nodes.Getitem):
        arg = node.arg
        return _names(node.node, name) and isinstance(arg, nodes.Const) and arg.value == key
    if isinstance(node, nodes.Getattr):
        return _names(node.node, name) and bool(node.attr == key)
    return False


def _dotted(node: Any) -> str | None:
    """An assignment target like ``ns.a`` as the dotted name ``_names`` reads."""
    from jinja2 import nodes

    if isinstance(node, nodes.NSRef):
        return f"{node.name}.{node.attr}"
    attrs = []
    while isinstance(node, nodes.Getattr):
        attrs.append(node.attr)
        node = node.node
    if isinstance(node, nodes.Name):
        return ".".join([node.name, *reversed(attrs)])
    return None


def _aliases(root: Any, name: str) -> list[str]:
    """``name`` and every name bound, directly or through others, to it."""
    from jinja2 import nodes

    found = [name]
    queue = [name]
    while queue:
        current = queue.pop(0)
        for assign in root.find_all(nodes.Assign):
            target, value = assign.target, assign.node
            new: list[str] = []
            if isinstance(target, nodes.Name) and _reads(value, current):
                new.append(target.name)
            if (
                isinstance(target, nodes.Name)
                and isinstance(value, nodes.Call)
                and isinstance(value.node, nodes.Name)
                and value.node.name == "namespace"
            ):
                new += [
                    f"{target.name}.{kw.key}" for kw in value.kwargs if _reads(kw.value, current)
                ]
            elif isinstance(target, (nodes.Getattr, nodes.NSRef)) and _reads(value, current):
                dotted = _dotted(target)
                new += [dotted] if dotted is not None else []
            for alias in new:
                if alias not in found:
                    found.append(alias)
                    queue.append(alias)
    return found


def _loop_target(loop: Any) -> str:
    from jinja2 import nodes

    if not isinstance(loop.target, nodes.Name):
        raise _Unsupported
    return str(loop.target.name)


def _message_names(root: Any) -> list[str]:
    """The targets of every loop over ``messages`` or a name bound to it."""
    from jinja2 import nodes

    bound = _aliases(root, "messages")
    return [
        _loop_target(loop)
        for loop in root.find_all(nodes.For)
        if any(_reads(loop.iter, name) for name in bound)
    ]


def _macro_loops(root: Any, messages: list[str]) -> tuple[set[int], dict[int, set[str]]]:
    """(ids of the loops inside macros; loop id -> the parameters of its macro that some
    call passes a message's content to, for macros that have such parameters)."""
    from jinja2 import nodes

    def is_content(arg: Any) -> bool:
        return any(_reads(arg, name, "content") for name in messages)

    inside: set[int] = set()
    params_of: dict[int, set[str]] = {}
    for macro in root.find_all(nodes.Macro):
        params = [arg.name for arg in macro.args]
        fed: set[str] = set()
        for call in root.find_all(nodes.Call):
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            fed.update(
                params[i] for i, arg in enumerate(call.args[: len(params)]) if is_content(arg)
            )
            fed.update(
                kw.key
                for kw in call.kwargs
                if isinstance(kw, nodes.Keyword) and kw.key in params and is_content(kw.value)
            )
        for loop in macro.find_all(nodes.For):
            inside.add(id(loop))
            if fed:
                params_of[id(loop)] = fed
    return inside, params_of


def _content_loops(root: Any) -> Iterator[str]:
    """The targets of the loops over a message's content, in template order (lazily: the
    first one decides)."""
    from jinja2 import nodes

    messages = _message_names(root)
    inside, params_of = _macro_loops(root, messages)
    for loop in root.find_all(nodes.For):
        it = loop.iter
        plain = it.name if isinstance(it, nodes.Name) else None
        if (
            any(_reads(it, name, "content") for name in messages)
            or (plain is not None and plain in params_of.get(id(loop), ()))
            or (plain == "content" and id(loop) not in inside)
        ):
            yield _loop_target(loop)


def detect_content_format(template: str, env: Any) -> ContentFormat:
    """The content format of ``template``, compiled and parsed in ``env`` (the
    environment it renders in, so its extensions' tags parse)."""
    try:
        env.from_string(template)
        root = env.parse(template)
    except Exception:  # it will fail to render too; until then, strings
        return "string"
    try:
        next(_content_loops(root))
    except Exception:  # no such loop (StopIteration), or one it cannot follow
        return "string"
    return "openai"
