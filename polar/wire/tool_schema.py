"""A tool's parameter schema held to what the providers themselves refuse: one that is not a JSON schema.

OpenAI, Anthropic and Google check a tool's schema before any work (``Invalid schema for function 'f'``); a
gateway that took ``{"type": 5}`` would render it into a prompt no provider would have accepted. ``check_schema``
walks a schema once, iteratively, and raises ``InvalidRequest`` naming the first offending field for

- a schema (or subschema under ``properties``, ``items``, ``anyOf``/``oneOf``/``allOf``, ``not``,
  ``additionalProperties``) that is neither an object nor a boolean;
- a ``type`` that is neither a JSON schema type name nor a non-empty list of them;
- ``properties`` that is not an object, ``required`` that is not a list of strings, ``enum`` that is not a list.

Nothing else is judged (keywords it does not know are the schema's own business, as they are to the providers).
"""

from __future__ import annotations

from typing import Any

from polar.errors import InvalidRequest

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_ONE = ("items", "not", "additionalProperties")  # a subschema (``items`` may also be a list of them)
_MANY = ("anyOf", "oneOf", "allOf")  # lists of subschemas


def check_schema(schema: Any, field: str, types: frozenset[str] = TYPES) -> None:
    """Raise ``InvalidRequest`` naming the part of ``schema`` (at ``field``) that is not a JSON schema (module
    docstring); ``types``: the type names it may use (Gemini's OpenAPI schemas add ``type_unspecified``)."""
    stack: list[tuple[Any, str]] = [(schema, field)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise _bad(path, "a JSON schema is an object")
        kind = node.get("type")
        if kind is not None and not _is_type(kind, types):
            raise _bad(f"{path}.type", f"must be one of {sorted(types)} or a list of them, not {kind!r:.40}")
        properties = node.get("properties")
        if properties is not None:
            if not isinstance(properties, dict):
                raise _bad(f"{path}.properties", "must be an object of schemas")
            stack.extend((sub, f"{path}.properties.{name}") for name, sub in properties.items())
        required = node.get("required")
        if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
            raise _bad(f"{path}.required", "must be a list of property names")
        if "enum" in node and not isinstance(node["enum"], list):
            raise _bad(f"{path}.enum", "must be a list")
        for key in _ONE:
            sub = node.get(key)
            if isinstance(sub, list) and key == "items":
                stack.extend((item, f"{path}.items[{i}]") for i, item in enumerate(sub))
            elif sub is not None:
                stack.append((sub, f"{path}.{key}"))
        for key in _MANY:
            subs = node.get(key)
            if subs is not None:
                if not isinstance(subs, list):
                    raise _bad(f"{path}.{key}", "must be a list of schemas")
                stack.extend((sub, f"{path}.{key}[{i}]") for i, sub in enumerate(subs))


def _is_type(kind: Any, types: frozenset[str]) -> bool:
    if isinstance(kind, str):
        return kind in types
    return isinstance(kind, list) and bool(kind) and all(isinstance(k, str) and k in types for k in kind)


def _bad(field: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: invalid JSON schema: {problem}", field=field)
