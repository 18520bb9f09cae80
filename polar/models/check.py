"""At start: does our tokenizer agree with the model the backend serves?

Asked of the server itself (SGLang and ``polar serve-model`` report ``vocab_size`` and ``eos_token_ids`` in
``/model_info``; both SGLang and vLLM tokenize on ``POST /tokenize``): the vocabulary size (a model's embedding
may be padded past its tokenizer, by at most PAD_ALLOWANCE ids, never smaller), the end-of-generation ids, and
the ids of a probe string. What the server does not report is not checked; anything it reports that disagrees
is a ConfigError naming both sides, raised before anything serves.
"""

from __future__ import annotations

from typing import Any

import httpx

from polar.errors import ConfigError
from polar.model_folder import ModelFolder, folder_tokenizer
from polar.models.resolve import ModelChoice, resolve_model_folder
from polar.tokens.tokenizer import ChatTokenizer

# Real models pad their embedding to a multiple of 64-256 ids (Qwen3: 151,669 tokens, 151,936 rows).
PAD_ALLOWANCE = 1024
PROBE = "Polar probe: héllo wörld 世界 — def f(x):\n\treturn x ** 2  # 12345 ...!?"


def _get(client: httpx.Client, url: str) -> dict[str, Any]:
    try:
        response = client.get(url)
        data = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tokenize(client: httpx.Client, url: str) -> list[int] | None:
    try:
        response = client.post(url, json={"prompt": PROBE, "add_special_tokens": False})
        data = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    return tokens if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) else None


def check_tokenizer_against_server(tokenizer: ChatTokenizer, base_url: str, *, timeout_s: float = 30.0) -> list[str]:
    """The checks that ran (for a log line); ConfigError on the first disagreement."""
    base = base_url.rstrip("/")
    ours = f"our tokenizer ({tokenizer.path})"
    theirs = f"the model {base} serves"
    done: list[str] = []
    with httpx.Client(timeout=timeout_s) as client:
        info = _get(client, base + "/model_info")
        vocab = info.get("vocab_size")
        if isinstance(vocab, int):
            if not vocab - PAD_ALLOWANCE <= tokenizer.vocab_size <= vocab:
                raise ConfigError(
                    f"vocabulary mismatch: {ours} has {tokenizer.vocab_size} ids, {theirs} has {vocab}; "
                    "point POLAR_MODEL_PATH at the served model's folder",
                    field="model_path",
                )
            done.append("vocab_size")
        eos = info.get("eos_token_ids")
        if isinstance(eos, list) and eos:
            if set(eos) != set(tokenizer.eos_ids):
                raise ConfigError(
                    f"end-of-generation ids differ: {ours} ends on {sorted(tokenizer.eos_ids)}, {theirs} on "
                    f"{sorted(eos)}",
                    field="model_path",
                )
            done.append("eos_token_ids")
        tokens = _tokenize(client, base + "/tokenize")
        if tokens is not None:
            expected = tokenizer.encode(PROBE)
            if tokens != expected:
                raise ConfigError(
                    f"tokenizers disagree on a probe string: {ours} gives {expected[:12]}..., {theirs} gives "
                    f"{tokens[:12]}...",
                    field="model_path",
                )
            done.append("probe")
    return done


def checked_model(choice: ModelChoice) -> tuple[ModelFolder, ChatTokenizer]:
    """Resolve ``choice``'s folder, load its tokenizer and, with a server, check the two agree (ConfigError)."""
    folder = resolve_model_folder(choice)
    tokenizer = folder_tokenizer(folder)
    for url in choice.backend_urls:  # every server of a fleet serves the same model
        check_tokenizer_against_server(tokenizer, url)
    return folder, tokenizer
