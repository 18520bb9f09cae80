"""Top-k logprobs and routed experts (issue 37): storage per 100k-token trajectory, and the CPU they add to a
gateway call.

Storage: a 100k-token agentic trajectory of ``--turns`` calls (each adds an even share of new prompt tokens and
``--output`` sampled ones), top-8 logprobs per sampled token and routed experts for 48 layers x top-8 of 128
experts per token, encoded by the gateway's own code (``polar.capture_extras.apply_extras``), against what the
server puts on the wire (int32 base64) and what storing each call's full routing would take (a call that
extends its parent asking ``routed_experts_start_len: 0``).

CPU: one gateway call's extras work, in this process's CPU time: reading an SGLang ``/generate`` response that
carries them (the body parsed with the experts' base64 cut out first, the output and extras readers, SIMD base64
and narrowing to uint8) and encoding them into the capture's columns, against the same response without extras,
in the same run; and what plain ``orjson.loads`` + ``base64`` would have cost.

    .venv/bin/python benchmarks/bench_extras.py [--tokens N] [--turns N] [--output N] [--calls N]
"""

from __future__ import annotations

import argparse
import base64
import time
from types import SimpleNamespace

import numpy as np
import orjson

from polar.backends.extras import ExtrasReader, loads_without_experts
from polar.backends.sglang_wire import OutputReader
from polar.capture_extras import CaptureOptions, apply_extras
from polar.inference import ExtrasRequest, GenerateExtras, GenerateRequest
from polar.models.moe_shape import MoEShape

LAYERS, TOP_EXPERTS, EXPERTS, K = 48, 8, 128, 8
SHAPE = MoEShape(LAYERS, TOP_EXPERTS, EXPERTS)


def _row() -> SimpleNamespace:
    return SimpleNamespace(
        top_k=None, top_ids=None, top_logprobs=None, experts_start=None, experts_layers=None, experts_k=None,
        routed_experts=None,
    )  # fmt: skip


def storage(tokens: int, turns: int, output: int) -> None:
    rng = np.random.default_rng(0)
    sampled = turns * output
    new_per_turn = (tokens - sampled) // turns
    sizes = {"top_ids": 0, "top_logprobs f32": 0, "top_logprobs f16": 0, "experts": 0}
    wire = full = 0
    sequence = 0
    for _turn in range(turns):
        n_prompt = sequence + new_per_turn
        start = max(sequence - 1, 0)  # the parent's rows end one before its sequence's end
        rows = n_prompt + output - 1 - start
        extras = GenerateExtras(
            top_ids=rng.integers(0, 150_000, (output, K)).astype(np.int32),
            top_logprobs=-rng.random((output, K)).astype(np.float32),
            routed_experts=rng.integers(0, EXPERTS, (rows, LAYERS, TOP_EXPERTS)).astype(np.uint8),
            routed_experts_start=start,
        )
        for dtype in ("float32", "float16"):
            row = _row()
            apply_extras(row, extras, CaptureOptions(top_logprobs=K, routed_experts=True, top_logprobs_dtype=dtype))
            sizes[f"top_logprobs {dtype.replace('float', 'f')}"] += len(row.top_logprobs)
        sizes["top_ids"] += len(row.top_ids)
        sizes["experts"] += len(row.routed_experts)
        wire += len(base64.b64encode(extras.routed_experts.astype("<i4").tobytes()))
        full += (n_prompt + output - 1) * LAYERS * TOP_EXPERTS  # uint8, whole sequence every call
        sequence = n_prompt + output
    mb = 1e6
    print(f"== storage per {sequence:,}-token trajectory ({turns} calls, {sampled:,} sampled tokens) ==")
    print(f"top-{K} ids (int32)                      {sizes['top_ids'] / mb:8.2f} MB")
    print(f"top-{K} logprobs float32 / float16       {sizes['top_logprobs f32'] / mb:8.2f} / "
          f"{sizes['top_logprobs f16'] / mb:.2f} MB")  # fmt: skip
    all_tokens = sequence * K * 8 / mb
    print(f"  (top-{K} on every one of the {sequence:,} tokens, float32: {all_tokens:.2f} MB)")
    print(f"routed experts {LAYERS} x top-{TOP_EXPERTS} (uint8)        {sizes['experts'] / mb:8.2f} MB "
          f"= {sizes['experts'] / sequence:.0f} B/token")  # fmt: skip
    print(f"  on the wire (base64 int32, the calls' deltas) {wire / mb:8.2f} MB  ({wire / sizes['experts']:.1f}x)")
    print(f"  every call's full routing, uint8              {full / mb:8.2f} MB  ({full / sizes['experts']:.1f}x)")
    total = sizes["top_ids"] + sizes["top_logprobs f32"] + sizes["experts"]
    print(f"total stored (float32 top-k)                   {total / mb:8.2f} MB")


def _response(n_prompt: int, output: int, start: int, top: bool, experts: bool) -> bytes:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 150_000, output).tolist()
    meta = {
        "id": "x",
        "finish_reason": {"type": "stop", "matched": ids[-1]},
        "prompt_tokens": n_prompt,
        "completion_tokens": output,
        "cached_tokens": 0,
        "weight_version": "v1",
        "weight_versions": [{"version": "v1", "start": 0, "end": output}],
        "e2e_latency": 1.0,
        "output_token_logprobs": [[-0.5, t, None] for t in ids],
    }
    if top:
        meta["output_top_logprobs"] = [
            [[float(-0.1 * j - rng.random()), int(t) + j, None] for j in range(K)] for t in ids
        ]  # fmt: skip
    if experts:
        rows = n_prompt + output - 1 - start
        routed = rng.integers(0, EXPERTS, (rows, LAYERS, TOP_EXPERTS)).astype("<i4")
        meta["routed_experts"] = base64.b64encode(routed.tobytes()).decode()
    return orjson.dumps({"text": "", "output_ids": ids, "meta_info": meta})


def _one_call(body: bytes, request: GenerateRequest, options: CaptureOptions | None) -> None:
    """What the sglang backend and the capture do with one non-streamed response."""
    payload = orjson.loads(body) if request.extras is None else loads_without_experts(body)
    reader = OutputReader("bench", request)
    new = reader.add(payload)[0]
    result = reader.result(payload)
    if request.extras is not None:
        extras = ExtrasReader("bench", request, SHAPE)
        extras.add(payload, len(new))
        apply_extras(_row(), extras.result(payload, len(result.output_ids)), options)


def cpu(calls: int, new_prompt: int, output: int, context: int) -> None:
    start = context - 1
    n_prompt = context + new_prompt
    prompt = tuple(range(n_prompt))
    cases = {}
    for name, top, experts in (
        ("without extras", False, False),
        (f"top-{K}", True, False),
        (f"experts {LAYERS}x{TOP_EXPERTS}", False, True),
        (f"top-{K} + experts", True, True),
    ):
        asked = ExtrasRequest(top_logprobs=K if top else 0, routed_experts=experts, routed_experts_start=start)
        options = CaptureOptions(top_logprobs=K if top else 0, routed_experts=experts)
        request = GenerateRequest(prompt, extras=asked if asked.any else None)
        cases[name] = (_response(n_prompt, output, start, top, experts), request, options if asked.any else None)
    print(
        f"== gateway CPU per call: {new_prompt:,} new prompt tokens + {output} sampled after {context:,} "
        f"({calls} calls each) =="
    )
    per_call = {}
    for name, (body, request, opts) in cases.items():
        _one_call(body, request, opts)  # warm
        began = time.process_time()
        for _ in range(calls):
            _one_call(body, request, opts)
        per_call[name] = (time.process_time() - began) / calls
        print(f"{name:<18} response {len(body) / 1e6:6.2f} MB   {per_call[name] * 1e3:7.3f} ms CPU/call")
    base = per_call["without extras"]
    for name in list(per_call)[1:]:
        print(f"added by {name}: {(per_call[name] - base) * 1e3:.3f} ms CPU/call ({per_call[name] / base:.0f}x)")
    body = cases[f"top-{K} + experts"][0]
    began = time.process_time()
    for _ in range(calls):
        base64.b64decode(orjson.loads(body)["meta_info"]["routed_experts"], validate=True)
    naive = (time.process_time() - began) / calls
    print(f"  (plain orjson.loads + base64 of the same body alone: {naive * 1e3:.3f} ms/call)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--output", type=int, default=400, help="sampled tokens per call")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    storage(args.tokens, args.turns, args.output)
    new_prompt = (args.tokens - args.turns * args.output) // args.turns
    cpu(args.calls, new_prompt, args.output, context=args.tokens // 2)


if __name__ == "__main__":
    main()
