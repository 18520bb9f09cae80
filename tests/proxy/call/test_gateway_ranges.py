"""Request fields are held to the providers' documented ranges: every row of the table in docs/limits.md, per
protocol, refused values get a 400 in the protocol's shape naming the field, the accepted edge a 200. The table is
read from the document, so a row cannot be documented without being tested."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from polar.backends.local import LocalBackend
from tests.proxy.asgi_gateway import asgi_gateway, open_session
from tests.proxy.gateway_server import settings_for
from tests.proxy.shapes import PROTOCOLS, error_problem

LIMITS = Path(__file__).resolve().parents[3] / "docs" / "limits.md"
ROW = re.compile(r"^\| (openai_chat|openai_responses|anthropic|gemini) \| `([^`]+)` \| [^|]+ \|([^|]*)\|([^|]*)\|$")


def table() -> list[tuple[str, str, list[Any], list[Any]]]:
    """(protocol, field path, accepted edges, refused values) of each row."""
    rows = []
    for line in LIMITS.read_text().splitlines():
        match = ROW.match(line.strip())
        if match:
            protocol, field, edge, refused = match.groups()
            values = [json.loads(v) for v in re.findall(r"`([^`]+)`", refused)]
            rows.append((protocol, field, [json.loads(v) for v in re.findall(r"`([^`]+)`", edge)], values))
    return rows


ROWS = table()


def test_the_table_covers_every_protocol():
    assert {row[0] for row in ROWS} == set(PROTOCOLS) and len(ROWS) >= 15


def _with(body: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    *parents, last = field.split(".")
    node = body
    for name in parents:
        node = node.setdefault(name, {})
    node[last] = value
    return body


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_documented_ranges_are_enforced(tmp_path, cache_dir, engine, protocol):
    settings = settings_for(tmp_path, cache_dir, default_max_tokens=2)
    asyncio.run(_ranges(settings, engine, protocol))


async def _ranges(settings, engine, name: str) -> None:
    protocol = PROTOCOLS[name]
    problems: list[str] = []
    async with asgi_gateway(settings, LocalBackend(engine)) as (_gw, client):
        key = (await open_session(client))["api_key"]
        for row_protocol, field, edges, refused in ROWS:
            if row_protocol != name:
                continue
            for value in refused:
                body = _with(protocol.body(max_tokens=2), field, value)
                reply = await client.post(protocol.url(False), json=body, headers=protocol.headers(key))
                where = f"{field}={value!r}"
                if reply.status_code != 400 or error_problem(name, 400, reply.json()):
                    problems.append(f"{where}: {reply.status_code} {reply.text[:200]}")
                elif field.split(".")[-1].lower() not in reply.text.lower():
                    problems.append(f"{where}: the error does not name the field: {reply.text[:200]}")
            for value in edges:
                body = _with(protocol.body(max_tokens=2), field, value)
                reply = await client.post(protocol.url(False), json=body, headers=protocol.headers(key))
                if reply.status_code != 200:
                    problems.append(f"{field}={value!r} (accepted edge): {reply.status_code} {reply.text[:200]}")
    assert not problems, "\n".join(problems)
