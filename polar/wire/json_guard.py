"""Limits on decoded JSON request bodies: what no provider accepts and what would break the gateway later.

``check_json`` walks a decoded body once (iteratively: a deep body never exhausts the stack) and raises an
``InvalidRequest`` naming the first offending field (``messages.0.content``) for

- nesting deeper than ``max_depth`` (a body nested deeper than Python's JSON parser can follow is refused by
  ``parse_json`` the same way);
- a string (value or key) longer than ``max_string_chars``;
- a number that is not finite: ``NaN``, ``Infinity`` and overflowing literals such as ``1e400`` (Python's
  parser accepts them; JSON does not, and the store cannot hold them);
- an integer outside the signed 64-bit range (no sampling knob or id needs more);
- a lone UTF-16 surrogate (``"\\ud800"``): it is no character, cannot be encoded as UTF-8, and would fail the
  tokenizer or the store much later.

NUL characters are valid JSON text and are kept: the store encodes them where it must (``db.types``). A body is
UTF-8 (RFC 8259; the providers refuse UTF-16 and UTF-32, which Python's parser would guess), and of a key given
twice the value that is dropped must pass the same checks (last wins, as in every parser; a ``NaN`` or a lone
surrogate cannot hide in the first).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from polar.errors import InvalidRequest
from polar.wire.body_digest import BodyDigest, RawHead, Repeats, body_digest, cut_repeated

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_BIG = float(2**63)


@dataclass(frozen=True)
class JsonLimits:
    """How deep and how long a request body's JSON may be (``POLAR_MAX_JSON_DEPTH``, ``POLAR_MAX_STRING_CHARS``)."""

    max_depth: int = 64
    max_string_chars: int = 8 * 1024 * 1024


DEFAULT_LIMITS = JsonLimits()


def parse_json(raw: bytes, limits: JsonLimits = DEFAULT_LIMITS) -> Any:
    """Decode ``raw`` and check it against ``limits``; every failure is an ``InvalidRequest`` (400).

    orjson first (fast, and strict: what it accepts has no NaN, no lone surrogate, no integer beyond 64 bits);
    a body it refuses, or one holding a float of 2**63 or more (orjson reads integers beyond 64 bits as floats),
    is decoded again by the standard parser, whose errors name the offending field."""
    return parse_json_after(raw, limits).value


@dataclass(frozen=True)
class CutBody:
    """A body decoded without the first ``count`` items of its list at ``key``: they repeat the whole list of the
    body it was checked against (``cut_repeated``). ``raw``: its bytes, for what needs the body whole."""

    key: str
    count: int
    raw: bytes

    def whole(self) -> Any:
        """The whole body (decoded again: only off the steady path, where the cut items are wanted)."""
        return orjson.loads(self.raw)


def whole_value(value: Any, cut: CutBody | None) -> Any:
    """The whole body of ``value``, a body decoded ``cut`` (or not: then ``value`` itself)."""
    return cut.whole() if cut is not None else value


@dataclass(frozen=True)
class ParsedBody:
    """A decoded body. ``strict``: it went the strict (orjson) way; then ``digest`` is what the session keeps to
    know what its next body repeats, and ``repeats`` what this one repeats of the body it was ``checked`` against.
    ``cut``: ``value`` lacks what the checked body's list held (``CutBody``)."""

    value: Any
    strict: bool
    digest: BodyDigest | None = None
    repeats: Repeats | None = None
    cut: CutBody | None = None


def parse_json_after(
    raw: bytes,
    limits: JsonLimits = DEFAULT_LIMITS,
    checked: BodyDigest | None = None,
    before_check: Callable[[Any, int], None] | None = None,
    *,
    digests: bool = False,
    key: str | None = None,
) -> ParsedBody:
    """``parse_json``, and whether the body went the strict (orjson) way: only such a body may be ``checked``
    for the next one. ``checked``: the digest of a strict body that passed these checks before (the session's
    previous request): a top-level value equal to its counterpart there, and the leading items of a list equal to
    its list, are not walked again (an agent re-sends its whole conversation every turn; only what is new costs).
    Where ``checked`` kept its list's place in its bytes (``RawHead``) and this body's bytes repeat them, those
    items are not even decoded: the result is ``cut`` (``ParsedBody``).
    ``digests``: the body's own digest is wanted (it is computed anyway when ``checked`` is given); ``key``: its
    list that a later body may extend (the conversation), whose place in ``raw`` the digest then keeps.
    ``before_check`` sees the decoded value, and how many leading items of that list it lacks, before it is walked
    (a cheap refusal, such as the cost bound, may then spare the walk)."""
    cut = _decode_cut(raw, checked.head) if checked is not None and checked.head is not None else None
    strict = _strict(raw, limits, checked, before_check, digests, key, cut)
    if strict is not None and strict.cut is not None and (strict.digest is None or strict.digest.head is None):
        # The cut list is not proved the body's own (its bytes after the cut are not its serialisation, or a
        # repeated key overrides it): decoded whole, as any body.
        strict = _strict(raw, limits, checked, before_check, digests, key, None)
    if strict is not None:
        return strict
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"request body is not valid JSON: not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})",
            field="body",
        ) from None
    try:
        value = json.loads(text, object_pairs_hook=lambda pairs: _object(pairs, limits))
    except RecursionError:
        raise InvalidRequest(
            f"request body is nested deeper than the limit of {limits.max_depth} levels", field="body"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, and ints beyond Python's digit limit
        raise InvalidRequest(f"request body is not valid JSON: {exc}", field="body") from None
    check_json(value, limits)
    return ParsedBody(value, False)


def _strict(
    raw: bytes,
    limits: JsonLimits,
    checked: BodyDigest | None,
    before_check: Callable[[Any, int], None] | None,
    digests: bool,
    key: str | None,
    cut: tuple[Any, CutBody] | None,
) -> ParsedBody | None:
    """The strict (orjson) way of ``parse_json_after``: None when it is not for this body (no JSON to orjson, or
    a float that may stand for an integer beyond 64 bits). ``cut``: the body decoded cut (``_decode_cut``)."""
    count = cut[1].count if cut is not None else 0
    try:
        value = cut[0] if cut is not None else orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if before_check is not None:
        before_check(value, count)
    want = digests or checked is not None
    own = body_digest(value, checked, raw=raw, key=key, cut=count) if want else None
    repeats = own.repeats(checked) if own is not None and checked is not None else None
    skip = repeats.parts if repeats is not None else None
    try:
        check_json(value, limits, strict=True, skip=skip, cut={cut[1].key: count} if cut is not None else None)
    except _MaybeBigInteger:
        return None
    return ParsedBody(value, True, own, repeats, cut[1] if cut is not None else None)


def _decode_cut(raw: bytes, head: RawHead) -> tuple[Any, CutBody] | None:
    """``raw`` decoded without the items ``head`` says it repeats; None when it does not repeat them, adds none
    after them, or is no JSON (it is then decoded whole, which names what is wrong)."""
    reduced = cut_repeated(raw, head)
    if reduced is None:
        return None
    try:
        value = orjson.loads(reduced)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get(head.key), list) or not value[head.key]:
        return None  # "[...,]": no item after the comma, which the whole body's decode refuses
    return value, CutBody(head.key, head.items, raw)


def _object(pairs: list[tuple[str, Any]], limits: JsonLimits) -> dict[str, Any]:
    """A decoded object (the standard parser's hook); the dropped value of a repeated key is checked too."""
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        for key, item in reversed(pairs):
            if key in seen:
                try:
                    check_json(item, limits)
                except InvalidRequest as exc:
                    field = _field((key,))
                    raise InvalidRequest(
                        f"{field}: a repeated key's dropped value: {exc.message}", field=field
                    ) from None
            seen.add(key)
    return value


MAX_TEXT_DEPTH = 256
"""How deep JSON held in a string field (``parse_json_text``) may nest: far beyond any real tool call, and well
within what Python's parser and the renders after it follow (past about 1,000 levels they raise RecursionError)."""


class NotJsonText(InvalidRequest):
    """Text that is not JSON at all (a syntax error); a caller may keep such text as it is (``parse_json_text``)."""


def parse_json_text(text: str, field: str, max_depth: int = MAX_TEXT_DEPTH) -> Any:
    """JSON held in a string field of a client's body (a tool call's arguments), decoded. Every failure either parser
    can raise is an ``InvalidRequest`` naming ``field``: ``NotJsonText`` for text that is not JSON; plain for JSON
    this gateway cannot take (nested deeper than ``max_depth``, which also keeps it out of the parsers' own
    recursion limits; an integer of more digits than Python converts, 4,300). orjson first (fast); what it refuses
    is decoded again by the standard parser, which takes NaN and integers beyond 64 bits as every model's client
    does, and whose error says what is wrong."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(text)
        except RecursionError:
            raise InvalidRequest(
                f"{field}: JSON nested deeper than the limit of {max_depth} levels", field=field
            ) from None
        except json.JSONDecodeError as exc:
            raise NotJsonText(f"{field}: not valid JSON: {exc}", field=field) from None
        except (ValueError, UnicodeError, TypeError) as exc:  # ints beyond Python's digit limit; odd code points
            raise InvalidRequest(f"{field}: JSON this gateway cannot read: {exc}", field=field) from None
    if _deeper_than(value, max_depth):
        raise InvalidRequest(f"{field}: JSON nested deeper than the limit of {max_depth} levels", field=field)
    return value


def _deeper_than(value: Any, max_depth: int) -> bool:
    """Whether ``value`` nests containers more than ``max_depth`` levels deep (iteratively: no stack to exhaust)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= max_depth:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


class _MaybeBigInteger(Exception):
    """A float of 2**63 or more on the strict path: orjson may have read an integer beyond 64 bits as it."""


def _field(path: tuple[str | int, ...]) -> str:
    # A key may itself hold a lone surrogate; the message naming it must still encode as UTF-8.
    text = ".".join(str(step) for step in path) or "body"
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_string(text: str, path: tuple[str | int, ...], limits: JsonLimits, what: str, strict: bool = False) -> None:
    if len(text) > limits.max_string_chars:
        raise InvalidRequest(
            f"{_field(path)}: {what} of {len(text)} characters exceeds the limit of {limits.max_string_chars}",
            field=_field(path),
        )
    if strict or text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"{_field(path)}: {what} holds a lone UTF-16 surrogate (U+{ord(text[exc.start]):04X}) at offset "
            f"{exc.start}; surrogates must come in pairs",
            field=_field(path),
        ) from None


def check_json(
    value: Any,
    limits: JsonLimits = DEFAULT_LIMITS,
    *,
    strict: bool = False,
    skip: dict[str, int] | None = None,
    cut: dict[str, int] | None = None,
) -> None:
    """Raise ``InvalidRequest`` naming a field of ``value`` that breaks ``limits`` (module docstring).
    ``strict``: ``value`` came from orjson, so its strings are valid Unicode (no surrogate check).
    ``skip``: top-level keys known to pass, wholly (-1) or in their first N list items (``parse_json``).
    ``cut``: top-level lists that lack their first N items (``ParsedBody.cut``): fields are named by the index
    an item has in the whole list."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = []
    if skip and isinstance(value, dict):
        if limits.max_depth <= 0:
            raise InvalidRequest(f"body: nested deeper than the limit of {limits.max_depth} levels", field="body")
        for key, child in value.items():
            _check_string(key, (key,), limits, "key", strict)
            known = skip.get(key)
            if known is None:
                stack.append((child, (key,)))
            elif known >= 0:
                if limits.max_depth <= 1:
                    raise InvalidRequest(
                        f"{_field((key,))}: nested deeper than the limit of {limits.max_depth} levels",
                        field=_field((key,)),
                    )
                missing = cut.get(key, 0) if cut else 0
                stack.extend((child[i], (key, i + missing)) for i in range(known - missing, len(child)))
    else:
        stack.append((value, ()))
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            _check_string(node, path, limits, "string", strict)
        elif isinstance(node, bool) or node is None:
            continue
        elif isinstance(node, float):
            if strict and abs(node) >= _BIG:
                raise _MaybeBigInteger()
            if not math.isfinite(node):
                raise InvalidRequest(
                    f"{_field(path)}: numbers must be finite, not {node!r}", field=_field(path)
                ) from None
        elif isinstance(node, int):
            if not INT64_MIN <= node <= INT64_MAX:
                raise InvalidRequest(f"{_field(path)}: integer out of the 64-bit range", field=_field(path))
        elif isinstance(node, dict | list):
            if len(path) >= limits.max_depth:
                raise InvalidRequest(
                    f"{_field(path)}: nested deeper than the limit of {limits.max_depth} levels", field=_field(path)
                )
            if isinstance(node, dict):
                for key, child in node.items():
                    _check_string(key, (*path, key), limits, "key", strict)
                    stack.append((child, (*path, key)))
            else:
                stack.extend((child, (*path, index)) for index, child in enumerate(node))
