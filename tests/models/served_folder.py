"""A real model folder behind ``polar gateway --model-path``, called with the OpenAI SDK and checked against
transformers on the same folder (tests/models/test_pretrained.py on the local engine, tests/slow on vLLM).

Each call runs in its own session, so it has exactly one capture; ``check_call`` asserts that the capture's prompt
ids are the folder's chat template applied by transformers, that its output ids decode to the text the SDK got,
that a greedy output is transformers' greedy ``generate``, and that its logprobs are a transformers forward's
log_softmax at the sampled ids (the calls sample at temperature 0 or 1, where every logprob semantics agrees).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import torch

from tests.conftest import CONTROL
from tests.models.test_family_gateway import _start, _stop
from tests.proxy.gateway_server import free_port

MAX_TOKENS = 16
QUESTION: list[Any] = [
    {"role": "user", "content": "What is the capital of France?"}
]  # the template adds its own system turn
DIALOGUE: list[Any] = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a primary colour."},
    {"role": "assistant", "content": "Red."},
    {"role": "user", "content": "Another one, and why it is primary."},
]
# SmolLM2's greedy answer, 'Ταυτού Συμαλακό', has Greek letters whose two UTF-8 bytes are split over two ids.
GREEK: list[Any] = [{"role": "user", "content": "Translate 'the window' into Greek."}]
TOP_K = 3  # top logprobs asked for on the calls that are not streamed
# name: (temperature, stream, messages)
CASES: dict[str, tuple[float, bool, list[Any]]] = {
    "greedy": (0.0, False, QUESTION),
    "greedy-stream": (0.0, True, DIALOGUE),
    "sampled": (1.0, False, DIALOGUE),
    "sampled-stream": (1.0, True, QUESTION),
    "greek-stream": (0.0, True, GREEK),
}


@dataclass(frozen=True)
class Served:
    """A ``polar gateway --model-path folder`` at ``url``."""

    folder: Path
    url: str

    def session(self) -> dict[str, Any]:
        reply = httpx.post(self.url + "/v1/sessions", json={}, headers=CONTROL, timeout=30)
        reply.raise_for_status()
        created: dict[str, Any] = reply.json()
        return created

    def client(self, session: dict[str, Any]) -> openai.OpenAI:
        return openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"], max_retries=0)

    def captures(self, session_id: str) -> list[dict[str, Any]]:
        reply = httpx.get(
            f"{self.url}/v1/sessions/{session_id}/captures", params={"full_prompt": True}, headers=CONTROL, timeout=30
        )
        reply.raise_for_status()
        captures: list[dict[str, Any]] = reply.json()["captures"]
        return captures


@contextlib.contextmanager
def gateway(folder: Path, tmp: Path, **settings: str) -> Iterator[Served]:
    """``polar gateway --model-path folder`` as a subprocess; ``settings`` are its POLAR_* variables (the backend)."""
    env = {**os.environ, "POLAR_HOME": str(tmp / "home"), "POLAR_DATABASE_URL": f"sqlite:///{tmp / 'gateway.db'}"}
    for name in ("POLAR_MODEL", "POLAR_MODEL_PATH", "POLAR_BACKEND", "POLAR_BACKEND_URL", "POLAR_CHAT_FORMAT"):
        env.pop(name, None)  # the folder alone decides what is served
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["gateway", "--model-path", str(folder), "--port", str(port)]
    process = _start(argv, env | settings, tmp / "gateway.log", url + "/health")
    try:
        yield Served(folder, url)
    finally:
        _stop(process)


class Reference:
    """transformers on the same folder, fp32: the chat template, greedy ``generate`` and a forward's logprobs."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self.tokenizer: Any = AutoTokenizer.from_pretrained(folder)
        self.model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def prompt_ids(self, messages: list[Any]) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
            )
        return [int(i) for i in out[0, len(prompt) :]]

    def logprobs(self, prompt: list[int], output: list[int]) -> tuple[list[float], list[list[float]]]:
        """log_softmax of the logits at each output position (temperature 1): at the id sampled there, and the
        ``TOP_K`` largest, best first."""
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, torch.tensor(output)[:, None])[:, 0].tolist()
        return chosen, logprobs.topk(TOP_K, dim=-1).values.tolist()


def call(served: Served, case: str) -> tuple[str, dict[str, Any], list[list[float]]]:
    """One chat completion of ``case`` through the SDK in a fresh session: the reply text, its capture and (not
    streamed) the ``TOP_K`` top logprobs the SDK got at each position."""
    temperature, stream, messages = CASES[case]
    session = served.session()
    client = served.client(session)
    seed = 1 if temperature else openai.omit
    model = served.folder.name
    if stream:
        chunks = client.chat.completions.create(
            model=model, messages=messages, temperature=temperature, max_tokens=MAX_TOKENS, seed=seed, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        top: list[list[float]] = []
    else:
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            temperature=temperature,
            max_tokens=MAX_TOKENS,
            seed=seed,
            logprobs=True,
            top_logprobs=TOP_K,
        )
        text = reply.choices[0].message.content or ""
        content = reply.choices[0].logprobs.content if reply.choices[0].logprobs else None
        top = [[t.logprob for t in item.top_logprobs] for item in content or []]
    [capture] = served.captures(session["session_id"])
    return text, capture, top


def check_call(served: Served, reference: Reference, case: str, tolerance: float) -> float:
    """Call ``case`` and check its capture against ``reference``; the largest logprob difference."""
    temperature, _, messages = CASES[case]
    text, capture, top = call(served, case)
    assert capture["status"] == "OK" and capture["sampling_params"]["temperature"] == temperature, capture
    prompt, output, logprobs = capture["prompt_ids"], capture["output_ids"], capture["output_logprobs"]
    template = reference.prompt_ids(messages)
    assert prompt == template, f"prompt ids {prompt} != the chat template's {template}"
    assert 0 < len(output) == len(logprobs) <= MAX_TOKENS, capture
    decoded = reference.tokenizer.decode(output, skip_special_tokens=True)
    assert decoded == text, f"output ids {output} decode to {decoded!r}, the SDK got {text!r}"
    if temperature == 0:
        greedy = reference.greedy(prompt, MAX_TOKENS)
        assert output == greedy, f"greedy output {output} != transformers' {greedy}"
    expected, expected_top = reference.logprobs(prompt, output)
    diff = float(max(abs(got - want) for got, want in zip(logprobs, expected, strict=True)))
    assert diff <= tolerance, f"logprobs differ by {diff:.2e} > {tolerance:.0e}: {logprobs} vs {expected}"
    if top:  # the top-k alternatives at each position: the reference's k best, best first
        assert len(top) == len(output) and all(len(row) == TOP_K for row in top), top
        worst = max(
            abs(g - w) for row, want in zip(top, expected_top, strict=True) for g, w in zip(row, want, strict=True)
        )
        assert worst <= tolerance, f"top-{TOP_K} logprobs differ by {worst:.2e}: {top} vs {expected_top}"
    return diff
