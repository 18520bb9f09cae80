"""An "instant" upstream for gateway benchmarks: SGLang's native ``/generate`` and OpenAI chat, no model.

Both surfaces answer the same fixed reply at once, so what a proxy in front of it measures is the proxy:

- ``POST /generate`` (input_ids in): the reply's ids (the small tokenizer's, ``<|im_end|>`` last), one
  logprob per id and a stop finish dict, in SGLang's exact response shape; with ``stream`` one cumulative
  SSE chunk per token, as SGLang sends by default (the gateway always streams from its backend).
- ``POST /v1/chat/completions``: the same reply as an OpenAI chat completion (or ``chat.completion.chunk``
  events when streamed).
- ``GET /model_info`` (``max_context_length`` 65536, or ``--context-length``), ``/v1/models``, ``/health``.
- ``POST /bench/config`` ``{"reply": "tool" | "text" | "long", "stream_token_delay_ms": N}``: the reply is a bash
  tool call in the Hermes format (default), a short text answer or a text answer of 50 tokens; streamed tokens
  wait N ms each (default 0), to stand in for a decoding model when timing the first byte.

    .venv/bin/python benchmarks/instant_backend.py --port 31000 [--context-length N] [--tokenize-chat]

``--tokenize-chat``: the chat route tokenizes the request's text (every message's content and the tool list)
with the small tokenizer before it answers, as a real engine's tokenizer manager does for a text request; the
direct arm of ``bench_agent_traffic.py`` pays that cost, which token-in moves into the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from polar.settings import get_settings
from polar.tokens.tokenizer import load_tokenizer

CONTEXT_LENGTH = 65536
WEIGHT_VERSION = "instant-v0"
MODEL = "instant"
TOOL_ARGS = {"cmd": "ls -la"}
TOOL_CALL_TEXT = '<tool_call>\n{"name": "bash", "arguments": ' + json.dumps(TOOL_ARGS) + "}\n</tool_call>"
STREAM_TEXT = "Done. The tests pass."
LONG_TEXT = "The build passed, the unit tests passed, the lint passed, and the docs were rebuilt. " * 4
LONG_TOKENS = 50  # the "long" reply: LONG_TEXT cut to this many tokens, the stop token included
LOGPROB = -0.125


class Reply:
    """A fixed reply as token ids (stop token included) with its per-prefix texts."""

    def __init__(self, ids: list[int], texts: list[str]):
        self.ids = ids
        self.texts = texts  # texts[k] = decode(ids[:k + 1]) without special tokens

    @classmethod
    def of(cls, tokenizer, text: str, n_tokens: int | None = None) -> Reply:
        ids = tokenizer.encode(text)[: None if n_tokens is None else n_tokens - 1] + [tokenizer.im_end_id]
        return cls(ids, [tokenizer.decode(ids[: k + 1], skip_special_tokens=True) for k in range(len(ids))])


def _meta(rid: str, n_prompt: int, reply: Reply, n: int, finished: bool, started: float) -> dict:
    ids = reply.ids[:n]
    return {
        "id": rid,
        "finish_reason": (
            {"type": "stop", "matched": ids[-1]} if n == len(reply.ids) else {"type": "length", "length": n}
        )
        if finished
        else None,
        "prompt_tokens": n_prompt,
        "completion_tokens": n,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "weight_version": WEIGHT_VERSION,
        "weight_versions": [{"version": WEIGHT_VERSION, "start": 0, "end": n}],
        "e2e_latency": time.perf_counter() - started,
        "output_token_logprobs": [[LOGPROB, i, None] for i in ids],
        "output_token_logprobs_length": n,
    }


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _chat_text(body: dict) -> str:
    """The text a real engine would render and tokenize for a chat body: every message's content, the tool calls'
    arguments and the tool list (a close stand-in for the template's output; the markers are a few ids)."""
    parts: list[str] = [json.dumps(body["tools"])] if body.get("tools") else []
    for message in body.get("messages", []):
        content = message.get("content")
        parts.append(content if isinstance(content, str) else json.dumps(content) if content else "")
        for call in message.get("tool_calls") or []:
            parts.append(json.dumps(call))
    return "\n".join(parts)


def create_app(tokenize_chat: bool = False) -> Starlette:
    tokenizer = load_tokenizer("small", get_settings().cache_dir)
    replies = {
        "tool": Reply.of(tokenizer, TOOL_CALL_TEXT),
        "text": Reply.of(tokenizer, STREAM_TEXT),
        "long": Reply.of(tokenizer, LONG_TEXT, LONG_TOKENS),
    }
    config = {"reply": "tool", "delay_s": 0.0}

    async def pause() -> None:
        if config["delay_s"]:
            await asyncio.sleep(config["delay_s"])

    async def generate(request: Request) -> Response:
        started = time.perf_counter()
        body = orjson.loads(await request.body())  # orjson: Starlette's json.loads of 50k ids is ~5 ms a call
        reply = replies[config["reply"]]
        n_prompt = len(body["input_ids"])
        rid = body.get("rid") or uuid.uuid4().hex
        n_total = min(len(reply.ids), (body.get("sampling_params") or {}).get("max_new_tokens") or CONTEXT_LENGTH)
        if not body.get("stream"):
            meta = _meta(rid, n_prompt, reply, n_total, True, started)
            return JSONResponse(
                {"text": reply.texts[n_total - 1], "output_ids": reply.ids[:n_total], "meta_info": meta}
            )

        async def chunks() -> AsyncIterator[bytes]:
            for n in range(1, n_total + 1):
                await pause()
                meta = _meta(rid, n_prompt, reply, n, n == n_total, started)
                yield _sse({"text": reply.texts[n - 1], "output_ids": reply.ids[:n], "meta_info": meta})
            yield _sse("[DONE]")

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        created = int(time.time())
        cid = "chatcmpl-" + uuid.uuid4().hex[:24]
        model = body.get("model", MODEL)
        if tokenize_chat:
            n_prompt = len(tokenizer.encode(_chat_text(body)))
        else:
            n_prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages", [])) // 4  # a rough count
        reply = replies[config["reply"]]
        if not body.get("stream") and config["reply"] == "tool":
            call = {
                "id": "call_" + uuid.uuid4().hex[:12],
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps(TOOL_ARGS)},
            }
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                            "finish_reason": "tool_calls",
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": n_prompt,
                        "completion_tokens": len(reply.ids),
                        "total_tokens": n_prompt + len(reply.ids),
                    },
                }
            )

        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": reply.texts[-1]},
                            "finish_reason": "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": n_prompt,
                        "completion_tokens": len(reply.ids),
                        "total_tokens": n_prompt + len(reply.ids),
                    },
                }
            )

        async def chunks() -> AsyncIterator[bytes]:
            base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
            yield _sse(
                {
                    **base,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                }
            )
            seen = ""
            for text in reply.texts:
                await pause()
                delta, seen = text[len(seen) :], text
                if delta:
                    yield _sse({**base, "choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}]})
            yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            yield _sse("[DONE]")

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def model_info(request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": MODEL,
                "served_model_name": MODEL,
                "is_generation": True,
                "weight_version": WEIGHT_VERSION,
                "max_context_length": CONTEXT_LENGTH,
                "vocab_size": tokenizer.vocab_size,
                "eos_token_ids": sorted(tokenizer.eos_ids),
            }
        )

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "owned_by": "bench", "max_model_len": CONTEXT_LENGTH}],
            }
        )

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def bench_config(request: Request) -> Response:
        body = await request.json()
        if body.get("reply") is not None:
            if body["reply"] not in replies:
                return JSONResponse({"error": {"message": f"reply must be one of {sorted(replies)}"}}, status_code=400)
            config["reply"] = body["reply"]
        if body.get("stream_token_delay_ms") is not None:
            config["delay_s"] = float(body["stream_token_delay_ms"]) / 1000
        return JSONResponse({"reply": config["reply"], "stream_token_delay_ms": config["delay_s"] * 1000})

    return Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),
            Route("/model_info", model_info),
            Route("/get_model_info", model_info),
            Route("/v1/models", models),
            Route("/health", health),
            Route("/bench/config", bench_config, methods=["POST"]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--context-length", type=int, default=65536)
    parser.add_argument("--tokenize-chat", action="store_true", help="tokenize chat requests, as an engine does")
    args = parser.parse_args()
    global CONTEXT_LENGTH  # read by the routes when they answer
    CONTEXT_LENGTH = args.context_length
    uvicorn.run(create_app(args.tokenize_chat), host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
