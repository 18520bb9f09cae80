"""The vLLM client's error mappings, against the scripted server of tests/backends/vllm_scripted.py: vLLM's
400s (context length, bad parameters) as ContextLengthExceeded and InvalidRequest naming our field, server
failures as backend errors, malformed replies and streams as protocol errors, a closed port and a timeout
as BackendUnavailable; an unknown endpoint, and a context length nobody told the client, refused by name.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from polar.backends.vllm import VLLMBackend
from polar.errors import (
    BackendError,
    BackendProtocolError,
    BackendUnavailable,
    ContextLengthExceeded,
    InvalidRequest,
)
from polar.inference import collect
from tests.backends.vllm_scripted import (
    BAD_TEMPERATURE,
    CMPL_PATH,
    COMPLETIONS_TOO_LONG,
    EMPTY_TOKEN_IDS,
    ENGINE_DEAD,
    GEN_PATH,
    GENERATE,
    GENERATE_SSE,
    GENERATE_TOO_LONG,
    MAX_TOKENS_ZERO,
    SEED_TOO_BIG,
    Reply,
    request,
    serve,  # noqa: F401  (fixture)
    sse,
)

# §3 Error mappings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "endpoint"),
    [(GEN_PATH, GENERATE_TOO_LONG, "generate"), (CMPL_PATH, COMPLETIONS_TOO_LONG, "completions")],
)
async def test_server_context_length_errors_map(serve, path, body, endpoint):
    server = await serve({f"POST {path}": Reply(body, 400)})
    backend = VLLMBackend(server.url, model="tiny", endpoint=endpoint)  # no context length: the server decides
    with pytest.raises(ContextLengthExceeded) as caught:
        await backend.generate(request([5] * 5000))
    await backend.aclose()
    assert (caught.value.prompt_tokens, caught.value.context_length, caught.value.status_code) == (5000, 4096, 400)


@pytest.mark.parametrize(
    ("body", "message", "field_name"),
    [
        (BAD_TEMPERATURE, "temperature must be non-negative", "temperature"),
        (EMPTY_TOKEN_IDS, "List should have at least 1 item", "input_ids"),
        (SEED_TOO_BIG, "less than or equal to 9223372036854775807", "seed"),
        (MAX_TOKENS_ZERO, "max_tokens must be at least 1", "max_new_tokens"),
    ],
)
async def test_bad_request_maps_to_invalid_request_with_server_message(serve, body, message, field_name):
    server = await serve({f"POST {GEN_PATH}": Reply(body, 400)})
    backend = VLLMBackend(server.url, model="tiny")
    with pytest.raises(InvalidRequest, match=message) as caught:
        await backend.generate(request())
    await backend.aclose()
    assert caught.value.field == field_name and not isinstance(caught.value, ContextLengthExceeded)


@pytest.mark.parametrize(("status", "kind"), [(500, BackendError), (503, BackendUnavailable), (404, BackendError)])
async def test_server_failures_map_to_backend_errors(serve, status, kind):
    server = await serve({f"POST {GEN_PATH}": Reply(ENGINE_DEAD, status)})
    backend = VLLMBackend(server.url, model="tiny")
    with pytest.raises(kind, match=f"answered {status}"):
        await backend.generate(request())
    await backend.aclose()


def _edited(path: list, value) -> str:
    """GENERATE with the field at ``path`` replaced (or removed when value is ...)."""
    reply = json.loads(GENERATE)
    node = reply
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(reply)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("<html>upstream proxy error</html>", "non-JSON"),
        ("[1, 2]", "expected an object"),
        (_edited(["choices"], ...), "missing field 'choices'"),
        (_edited(["choices"], []), "0 choices"),
        (_edited(["choices", 0, "token_ids"], ...), "missing field 'token_ids'"),
        (_edited(["choices", 0, "token_ids"], [1975, 1208]), "2 token ids but 3 logprobs"),
        (_edited(["choices", 0, "logprobs"], None), "3 token ids but 0 logprobs"),
        (_edited(["choices", 0, "logprobs", "content", 1, "token_id"], 7), "does not match sampled id 1208"),
        (_edited(["choices", 0, "logprobs", "content", 0, "logprob"], "x"), "expected a number"),
        (_edited(["choices", 0, "finish_reason"], "error"), "finish_reason 'error'"),
        (_edited(["choices", 0, "weight_versions"], [{"version": "v"}]), "missing field 'start'"),
    ],
)
async def test_malformed_replies_are_protocol_errors(serve, body, message):
    server = await serve({f"POST {GEN_PATH}": Reply(body)})
    backend = VLLMBackend(server.url, model="tiny")
    with pytest.raises(BackendProtocolError, match=message):
        await backend.generate(request())
    await backend.aclose()


@pytest.mark.parametrize(
    ("body", "kind", "message"),
    [
        (
            GENERATE_SSE.replace("data: [DONE]\n\n", "").replace('"length"', "null"),
            BackendProtocolError,
            "without a finish_reason",
        ),
        ("data: {not json\n\n", BackendProtocolError, "stream event is not JSON"),
        (f"{GENERATE_SSE.split(chr(10))[0]}\n\ndata: {ENGINE_DEAD}\n\ndata: [DONE]\n\n", BackendError, "answered 500"),
        ("data: " + BAD_TEMPERATURE + "\n\ndata: [DONE]\n\n", InvalidRequest, "temperature must be non-negative"),
    ],
)
async def test_stream_errors(serve, body, kind, message):
    server = await serve({f"POST {GEN_PATH}": sse(body)})
    backend = VLLMBackend(server.url, model="tiny")
    with pytest.raises(kind, match=message):
        await collect(backend.stream(request()))
    await backend.aclose()


async def test_stream_http_error_before_first_event(serve):
    server = await serve({f"POST {GEN_PATH}": Reply(GENERATE_TOO_LONG, 400)})
    backend = VLLMBackend(server.url, model="tiny")
    with pytest.raises(ContextLengthExceeded):
        await collect(backend.stream(request([5] * 5000)))
    await backend.aclose()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_closed_port_is_unavailable_naming_the_url():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(BackendUnavailable, match=f"vLLM at {url} is unreachable: ConnectError"):
        await VLLMBackend.connect(url)
    backend = VLLMBackend(url, model="tiny")
    for call in (backend.generate(request()), collect(backend.stream(request())), backend.pause()):
        with pytest.raises(BackendUnavailable, match=url):
            await call
    await backend.aclose()


async def test_timeout_is_unavailable(serve):
    server = await serve({f"POST {GEN_PATH}": Reply(GENERATE, delay_s=2.0)})
    backend = VLLMBackend(server.url, model="tiny", timeout_s=0.2)
    with pytest.raises(BackendUnavailable, match="ReadTimeout"):
        await backend.generate(request())
    await backend.aclose()


def test_unknown_endpoint_and_unknown_context_length():
    with pytest.raises(InvalidRequest, match="unknown vLLM endpoint 'chat'"):
        VLLMBackend("http://127.0.0.1:1", model="tiny", endpoint="chat")  # type: ignore[arg-type]
    backend = VLLMBackend("http://127.0.0.1:1", model="tiny")
    with pytest.raises(BackendError, match="context length is unknown"):
        _ = backend.context_length
    asyncio.run(backend.aclose())
