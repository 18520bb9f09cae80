"""Fuzzed bodies on every protocol, on SQLite and Postgres: no response >= 500, every error in the provider's shape.

Per protocol at least 500 bodies from a seeded generator (``tests.proxy.fuzz_bodies``): each class of bad input
the gateway must refuse as a 400 naming the field (non-finite numbers, lone surrogates, nesting, oversize strings
and integers, provider refusals: out-of-range sampling, thinking budgets, empty models, orphan tool results, bodies
not in UTF-8, repeated keys hiding NaN or a lone surrogate), NUL text it must accept and store, and random
mutations of valid bodies. The gateway runs in-process (ASGI) on the tiny local model with a two-token budget.
No answer is a 5xx and none hangs.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from polar.backends.local import LocalBackend
from tests.pg import STORES, migrated_store
from tests.proxy.asgi_gateway import CONTROL, asgi_gateway, captures, open_session
from tests.proxy.fuzz_bodies import DEPTH_LIMIT, STRING_LIMIT, Case, cases_for
from tests.proxy.gateway_server import settings_for
from tests.proxy.shapes import PROTOCOLS, Protocol, error_problem, stream_outcome

BODIES_PER_PROTOCOL = 500
SEED = 13
SESSION_CALLS = 40
HANG_S = 60.0  # far beyond any answer here (a two-token budget): a call past it hangs

COUNT_PATHS = {"anthropic": "/v1/messages/count_tokens", "gemini": "/v1beta/models/tiny:countTokens"}


def _url(protocol: Protocol, case: Case) -> str:
    return COUNT_PATHS[protocol.name] if case.count_tokens else protocol.url(case.stream)


async def _send(client, protocol: Protocol, key: str, case: Case) -> list[str]:
    """Problems with the gateway's answer to ``case`` (none when it is right; no answer within ``HANG_S`` is one)."""
    where = f"{protocol.name} {case.label} ({case.raw[:80]!r})"
    try:
        reply = await asyncio.wait_for(
            client.post(
                _url(protocol, case),
                content=case.raw,
                headers={**protocol.headers(key), "content-type": "application/json"},
            ),
            HANG_S,
        )
    except TimeoutError:
        return [f"{where}: no answer within {HANG_S:g} s (a hang)"]
    status = reply.status_code
    if status >= 500:
        return [f"{where}: {status} {reply.text[:300]}"]
    if case.expect == "ok" and status != 200:
        return [f"{where}: expected 200, got {status} {reply.text[:300]}"]
    if case.expect == "invalid" and status not in (400, 413):
        return [f"{where}: expected a 400, got {status} {reply.text[:300]}"]
    if status >= 400:
        try:
            body = reply.json()
        except json.JSONDecodeError:
            return [f"{where}: error body is not JSON: {reply.text[:300]}"]
        problem = error_problem(protocol.name, status, body)
        if problem:
            return [f"{where}: {problem}"]
        if case.field and case.field.lower() not in reply.text.lower():
            return [f"{where}: the error does not name {case.field!r}: {reply.text[:300]}"]
    elif reply.headers.get("content-type", "").startswith("text/event-stream") and (
        stream_outcome(protocol.name, reply.text) != "complete"
    ):
        return [f"{where}: stream did not complete: {reply.text[-300:]}"]
    return []


async def _fuzz(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (_gw, client):
        problems: list[str] = []
        for protocol in PROTOCOLS.values():
            sessions: list[dict] = []
            for index, case in enumerate(cases_for(protocol, BODIES_PER_PROTOCOL, SEED)):
                if index % SESSION_CALLS == 0:  # a session's history grows with its calls; keep each short
                    sessions.append(await open_session(client))
                problems += await _send(client, protocol, sessions[-1]["api_key"], case)
            # NUL text is stored faithfully and comes back exactly as the harness sent it
            stored = [
                c["request"]
                for session in sessions[:2]  # the explicit cases come first
                for c in await captures(client, session["session_id"], requests=True)
            ]
            assert any("a\\u0000b\\u0000" in json.dumps(r) for r in stored), protocol.name
        for raw in (b"[" * 100_000, b'{"policy": ' + b"[" * 5000 + b"]" * 5000 + b"}", b'{"models": [NaN]}', b"\xff"):
            reply = await client.post("/v1/sessions", content=raw, headers=CONTROL)
            if reply.status_code != 400 or error_problem("openai_chat", 400, reply.json()):
                problems.append(f"POST /v1/sessions {raw[:40]!r}: {reply.status_code} {reply.text[:200]}")
        for path in ("/health", "/health/live", "/health/ready"):
            reply = await client.get(path)
            if reply.status_code != 200 or "status" not in reply.json():
                problems.append(f"GET {path}: {reply.status_code} {reply.text[:200]}")
        assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:30])


@pytest.mark.parametrize("store", STORES)
def test_fuzzed_bodies_never_get_a_5xx(store, tmp_path, cache_dir, engine):
    with migrated_store(store, tmp_path) as url:
        settings = settings_for(
            tmp_path,
            cache_dir,
            database_url=url,
            default_max_tokens=2,
            max_string_chars=STRING_LIMIT,
            max_json_depth=DEPTH_LIMIT,
        )
        asyncio.run(_fuzz(settings, engine))
