"""The pipeline's session calls on a live gateway: a rollout's session is opened with a new key each time (the
old key stops working at once), closed idempotently, and unreachable gateways raise GatewayError."""

from __future__ import annotations

import httpx
import pytest

from polar.errors import GatewayError
from polar.rollout import submit_tasks
from polar.rollout.gateway_client import GatewayClient
from tests.conftest import TEST_CONTROL_TOKEN
from tests.rollout.helpers import answer_task


def chat(access, text="hi"):
    return httpx.post(
        access.base_urls["openai"] + "/chat/completions",
        headers={"Authorization": f"Bearer {access.api_key}"},
        json={"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 2},
        timeout=30,
    )


async def test_reopening_a_session_replaces_its_key(context, sqlite_gateway):
    (rollout_id,) = submit_tasks(context.factory, [answer_task(samples=1)])[0].rollout_ids
    client = GatewayClient(sqlite_gateway.url, control_token=TEST_CONTROL_TOKEN)
    first = await client.open_session(rollout_id)
    assert first.session_id == rollout_id and chat(first).status_code == 200
    assert first.context_length and first.context_length > 0  # the served model's window (adapters pass it on)
    await client.close_session(rollout_id)
    await client.close_session(rollout_id)  # idempotent
    assert chat(first).status_code == 403
    second = await client.open_session(rollout_id)
    assert second.api_key != first.api_key
    assert chat(second).status_code == 200  # reopened
    assert chat(first).status_code == 401  # the old key is gone


async def test_an_unreachable_gateway_is_a_gateway_error():
    with pytest.raises(GatewayError, match="cannot reach the gateway"):
        await GatewayClient("http://127.0.0.1:9", timeout_s=2).open_session("x")
