"""A seeded generator of request bodies for the gateway's fuzz suite: explicit classes of bad input, then
random mutations of valid bodies. Each case is raw bytes (``NaN``, ``1e400`` and lone surrogates cannot be written
by ``json.dumps``) with what the gateway must answer.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any

from tests.proxy.shapes import Protocol

STRING_LIMIT = 2000
"""``max_string_chars`` of the fuzzed gateway: small, so the oversize class stays cheap."""
DEPTH_LIMIT = 32


@dataclass(frozen=True)
class Case:
    label: str
    raw: bytes
    stream: bool = False
    count_tokens: bool = False
    expect: str = "any"  # "ok" (200), "invalid" (400/413), or "any" (anything below 500)
    field: str | None = None  # a word the error message must contain


def _dump(body: Any) -> bytes:
    return json.dumps(body).encode()


def _with(body: dict[str, Any], key: str, raw_value: str) -> bytes:
    """``body`` with ``key`` set to the raw JSON text ``raw_value`` (which ``json.dumps`` could not write)."""
    marker = "__polar_fuzz_marker__"
    return json.dumps({**body, key: marker}).replace(f'"{marker}"', raw_value).encode()


def _nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


TEXT = "fuzz-text"


def explicit_cases(protocol: Protocol) -> list[Case]:
    """Every class of bad input the issue names, for this protocol, plus valid bodies that must succeed."""
    cases: list[Case] = []
    valid = protocol.body(TEXT)
    sampling_key = {
        "openai_chat": "temperature",
        "openai_responses": "temperature",
        "anthropic": "temperature",
        "gemini": "generationConfig",
    }[protocol.name]

    def raw_text(value: str) -> bytes:
        return _dump(valid).replace(json.dumps(TEXT).encode(), value.encode())

    for stream in (False, True):
        cases.append(Case("valid", _dump(protocol.body("hello there", stream=stream)), stream, expect="ok"))
        cases.append(Case("nul in text", raw_text('"a\\u0000b\\u0000"'), stream, expect="ok"))
        cases.append(Case("paired surrogates", raw_text('"emoji \\ud83d\\ude00"'), stream, expect="ok"))
    for value in ("NaN", "Infinity", "-Infinity", "1e400", "-1e400"):
        if protocol.name == "gemini":
            raw = _with(valid, "generationConfig", f'{{"temperature": {value}}}')
        else:
            raw = _with(valid, sampling_key, value)
        cases.append(Case(f"non-finite {value}", raw, expect="invalid", field="temperature"))
        cases.append(Case(f"non-finite {value} in text", raw_text(value), expect="invalid"))
    for raw_value in ('"\\ud800"', '"x\\udfffy"', '"\\udc00\\ud800"'):
        cases.append(Case("lone surrogate", raw_text(raw_value), expect="invalid", field="surrogate"))
    cases.append(
        Case("lone surrogate key", _with(valid, "meta", '{"\\ud800": 1}'), expect="invalid", field="surrogate")
    )
    for depth in (DEPTH_LIMIT + 1, 200, 5000, 200_000):
        cases.append(
            Case(f"nested {depth}", _with(valid, "metadata", _nested(depth)), expect="invalid", field="nested")
        )
    cases.append(Case("nested array body", b"[" * 100_000 + b"]" * 100_000, expect="invalid"))
    cases.append(Case("long string", raw_text(json.dumps("x" * (STRING_LIMIT + 1))), expect="invalid", field="limit"))
    cases.append(Case("long key", _with(valid, "k" * (STRING_LIMIT + 1), "1"), expect="invalid", field="limit"))
    cases.append(Case("huge int", _with(valid, "seed", "1" + "0" * 30), expect="invalid", field="seed"))
    cases.append(Case("5000-digit int", _with(valid, "seed", "9" * 5000), expect="invalid"))
    for raw in (b"", b"{", b"\xff\xfe", b"null", b"42", b'"text"', b"[]", b"{}"):
        cases.append(Case("not a request", raw, expect="invalid"))
    if protocol.name == "openai_responses":
        for empty in ('""', "[]"):
            cases.append(Case("empty input", _with(valid, "input", empty), expect="invalid", field="input"))
    if protocol.name == "anthropic":
        for choice in ('{"type": "bogus"}', '{"type": "tool"}', '"auto"', "[]"):
            cases.append(
                Case("bad tool_choice", _with(valid, "tool_choice", choice), expect="invalid", field="tool_choice")
            )
        cases.append(Case("good tool_choice", _with(valid, "tool_choice", '{"type": "auto"}'), expect="ok"))
    if protocol.name == "gemini":
        cases.append(
            Case("empty part", _dump({"contents": [{"role": "user", "parts": [{}]}]}), expect="invalid", field="parts")
        )
    cases += _provider_refusals(protocol, valid)
    if protocol.name in ("anthropic", "gemini"):
        counted = {k: v for k, v in valid.items() if k != "max_tokens"}
        cases.append(Case("count_tokens", _dump(counted), count_tokens=True, expect="ok"))
        cases.append(
            Case("count_tokens nested", _with(counted, "x", _nested(5000)), count_tokens=True, expect="invalid")
        )
        cases.append(Case("count_tokens nan", _with(counted, "x", "NaN"), count_tokens=True, expect="invalid"))
        cases.append(Case("count_tokens surrogate", raw_text('"\\ud800"'), count_tokens=True, expect="invalid"))
        cases.append(Case("count_tokens junk", b"[1, 2", count_tokens=True, expect="invalid"))
    return cases


def _provider_refusals(protocol: Protocol, valid: dict[str, Any]) -> list[Case]:
    """Inputs the providers refuse (issue 32): out-of-range sampling, negative thinking budgets, empty model names,
    orphan tool results, bodies not in UTF-8, and repeated keys whose dropped value is NaN or a lone surrogate."""
    cases: list[Case] = []
    for value in ("2.5", "3.0", "1e308"):
        if protocol.name == "gemini":
            raw = _with(valid, "generationConfig", f'{{"temperature": {value}}}')
        else:
            raw = _with(valid, "temperature", value)
        cases.append(Case(f"temperature {value}", raw, expect="invalid", field="temperature"))
    if protocol.name == "gemini":
        for value in ("1e308", "0", "2147483648"):
            raw = _with(valid, "generationConfig", f'{{"topK": {value}}}')
            cases.append(Case(f"topK {value}", raw, expect="invalid", field="topK"))
        raw = _with(valid, "generationConfig", '{"thinkingConfig": {"thinkingBudget": -5}}')
        cases.append(Case("negative thinking budget", raw, expect="invalid", field="thinkingBudget"))
    else:
        cases.append(Case("empty model", _with(valid, "model", '""'), expect="invalid", field="model"))
    if protocol.name == "anthropic":
        raw = _with(valid, "thinking", '{"type": "enabled", "budget_tokens": -1}')
        cases.append(Case("negative thinking budget", raw, expect="invalid", field="budget_tokens"))
        orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}
        cases.append(
            Case("orphan tool result", _dump({**valid, "messages": [orphan]}), expect="invalid", field="toolu_x")
        )
    if protocol.name == "openai_chat":
        orphan = {"role": "tool", "tool_call_id": "call_x", "content": "r"}
        body = {**valid, "messages": [*valid["messages"], orphan]}
        cases.append(Case("orphan tool result", _dump(body), expect="invalid", field="call_x"))
    if protocol.name == "openai_responses":
        orphan = {"type": "function_call_output", "call_id": "call_x", "output": "r"}
        body = {**valid, "input": [{"role": "user", "content": "hi"}, orphan]}
        cases.append(Case("orphan tool result", _dump(body), expect="invalid", field="call_x"))
    text = json.dumps(valid)
    for encoding in ("utf-16", "utf-16-le", "utf-32"):
        # without a byte-order mark UTF-16 is valid UTF-8 (ASCII and NULs), and no JSON
        named = "utf-8" if encoding != "utf-16-le" else None
        cases.append(Case(f"{encoding} body", text.encode(encoding), expect="invalid", field=named))
    first = next(iter(valid))
    for hidden in ("NaN", '"\\ud800"', "Infinity"):
        raw = f'{{"{first}": {hidden}, '.encode() + _dump(valid)[1:]
        cases.append(Case(f"repeated key hiding {hidden}", raw, expect="invalid", field=first))
    return cases


# ---- random mutations -----------------------------------------------------------------------------------

_STRINGS = ["", "a", "hi", "\u0000", "tool", "user", "assistant", "model", "system", "ü", "\U0001f600", "x" * 50]


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-3, 3)  # small: a mutated max_tokens must never ask for a long generation
    if kind == 3:
        return rng.choice([0.0, -1.5, 0.5, 1e300, -1e-300, 2.0])
    if kind in (4, 5):
        return rng.choice(_STRINGS)
    if kind == 6:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind == 7:
        return {rng.choice(_STRINGS): _random_json(rng, depth + 1) for _ in range(rng.randrange(3))}
    return {"type": rng.choice(["text", "image", "tool_use", "function_call", "bogus"]), "text": rng.choice(_STRINGS)}


def _containers(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    if isinstance(node, dict | list):
        found.append(path)
        for key, child in node.items() if isinstance(node, dict) else enumerate(node):
            found += _containers(child, (*path, key))
    return found


def mutated(protocol: Protocol, rng: random.Random) -> Case:
    stream = rng.random() < 0.3
    body: Any = copy.deepcopy(protocol.body(rng.choice(_STRINGS[1:]), stream=stream, max_tokens=rng.randint(1, 2)))
    if rng.random() < 0.05:
        return Case("random json", _dump(_random_json(rng)), stream)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_containers(body))
        node = body
        for key in path:
            node = node[key]
        if isinstance(node, dict):
            key = rng.choice([*node.keys(), "extra"]) if node else "extra"
            if key == "max_tokens" or key == "max_output_tokens":
                continue  # keep generations tiny; the limits on numbers are explicit cases
            if key in node and rng.random() < 0.3:
                del node[key]
            else:
                node[key] = _random_json(rng)
        elif node:
            index = rng.randrange(len(node))
            if rng.random() < 0.3:
                del node[index]
            else:
                node[index] = _random_json(rng)
    return Case("mutated", _dump(body), stream)


def cases_for(protocol: Protocol, n: int, seed: int) -> list[Case]:
    """At least ``n`` cases: every explicit one, then seeded random mutations."""
    rng = random.Random(f"{seed}-{protocol.name}")
    cases = explicit_cases(protocol)
    while len(cases) < n:
        cases.append(mutated(protocol, rng))
    return cases
