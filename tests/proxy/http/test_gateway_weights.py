"""``POST /v1/admin/weights``: new weights reach the gateway's backend and later captures carry their version."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from safetensors.torch import save, save_file

from polar.backends.local import LocalBackend
from polar.models.engine import LocalEngine
from polar.models.sampling import rescore
from tests.conftest import CONTROL
from tests.proxy.gateway_server import GatewayServer, settings_for


@pytest.fixture(scope="module")
def own_engine(tiny_model_dir, small_tokenizer):
    """This module changes weights, so it has an engine of its own (not the session's shared one)."""
    eng = LocalEngine(tiny_model_dir, small_tokenizer)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, cache_dir, own_engine):
    tmp = tmp_path_factory.mktemp("weights")
    with GatewayServer(settings_for(tmp, cache_dir), backend=LocalBackend(own_engine)) as server:
        yield server


def perturbed(engine: LocalEngine, seed: int) -> dict[str, torch.Tensor]:
    noise = torch.Generator().manual_seed(seed)
    return {
        k: (v + 0.05 * torch.randn(v.shape, generator=noise)).contiguous() for k, v in engine.model.state_dict().items()
    }


def chat_once(gateway) -> dict:
    session = gateway.session()
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6)
    return gateway.captures(session["session_id"])[-1]


def test_tensor_upload_swaps_weights_and_captures_carry_the_version(gateway, own_engine):
    weights = perturbed(own_engine, 1)
    reply = httpx.post(
        f"{gateway.url}/v1/admin/weights",
        params={"version": "step-1"},
        content=save(weights),
        headers={"content-type": "application/octet-stream", **CONTROL},
        timeout=30,
    )
    assert reply.status_code == 200 and reply.json()["weight_version"] == "step-1"
    assert torch.equal(own_engine.model.state_dict()["lm_head.weight"], weights["lm_head.weight"])
    capture = chat_once(gateway)
    assert capture["weight_version"] == "step-1"
    expected = rescore(
        own_engine.model, capture["prompt_ids"] + capture["output_ids"], capture["n_prompt"], 1.0, own_engine.semantics
    )
    assert max(abs(a - b) for a, b in zip(expected, capture["output_logprobs"], strict=True)) < 1e-5


def test_checkpoint_path_and_relabel(gateway, own_engine, tmp_path):
    save_file(perturbed(own_engine, 2), tmp_path / "model.safetensors")
    reply = httpx.post(
        f"{gateway.url}/v1/admin/weights", json={"version": "step-2", "checkpoint_path": str(tmp_path)}, headers=CONTROL
    )
    assert reply.status_code == 200 and reply.json()["weight_version"] == "step-2"
    assert (
        httpx.post(f"{gateway.url}/v1/admin/weights", json={"version": "step-2b"}, headers=CONTROL).json()[
            "weight_version"
        ]
        == "step-2b"
    )
    assert chat_once(gateway)["weight_version"] == "step-2b"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"json": {"checkpoint_path": "/x"}}, "version"),
        ({"json": {"version": "v", "extra": 1}}, "extra"),
        ({"content": b"not json"}, "body"),
        (
            {
                "content": b"garbage",
                "headers": {"content-type": "application/octet-stream"},
                "params": {"version": "v"},
            },
            "body",
        ),
        ({"content": b"x", "headers": {"content-type": "application/octet-stream"}}, "version"),
        ({"json": {"version": "v", "checkpoint_path": "/no/such/folder"}}, "model_path"),
    ],
)
def test_bad_weight_requests_get_a_400_naming_the_field(gateway, kwargs, field):
    before = httpx.get(f"{gateway.url}/health").json()["weight_version"]
    kwargs = {**kwargs, "headers": {**kwargs.get("headers", {}), **CONTROL}}
    reply = httpx.post(f"{gateway.url}/v1/admin/weights", **kwargs)
    assert reply.status_code == 400, reply.text
    assert field in reply.json()["error"]["message"] or reply.json()["error"].get("param") == field
    assert httpx.get(f"{gateway.url}/health").json()["weight_version"] == before


def test_a_session_key_cannot_push_weights(gateway):
    session = gateway.session()
    reply = httpx.post(
        f"{gateway.url}/v1/admin/weights",
        json={"version": "evil"},
        headers={"Authorization": f"Bearer {session['api_key']}"},
    )
    assert reply.status_code == 403
