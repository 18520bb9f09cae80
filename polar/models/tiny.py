"""Models by name: the toy models of the tests and the embedded demo, and the pretrained ones Polar can fetch.

A toy name is a TinyModelSpec; its folder is made by the same code as ``polar model init`` the first time it is
asked for and cached under ``cache_dir/models``. A pretrained name (``polar.models.pretrained``, e.g.
``smollm2-135m-instruct``) is fetched and converted on first use, as ``polar model fetch`` does. Nothing else
about either is special: the gateway, the judge and the exports read its folder like any model's
(polar/model_folder.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from polar.errors import InvalidRequest
from polar.models.init import TinyModelSpec, init_model_folder
from polar.models.pretrained import PRETRAINED, fetch_model

if TYPE_CHECKING:
    from polar.tokens.tokenizer import ChatTokenizer

MODEL_SPECS: dict[str, TinyModelSpec] = {
    "tiny": TinyModelSpec(tokenizer="small"),
    "tiny-qwen": TinyModelSpec(tokenizer="qwen"),
    # Real CLIs send 6k-40k-token system prompts; same weights as "tiny" (the seed decides them), longer RoPE range.
    "tiny-long": TinyModelSpec(tokenizer="small", max_position_embeddings=65536),
    # Qwen3-MoE layers (8 experts, top-2, a router each): routed experts and top-k logprobs are real here.
    "tiny-moe": TinyModelSpec(tokenizer="small", num_experts=8, num_experts_per_tok=2),
}


def get_spec(name: str) -> TinyModelSpec:
    if name not in MODEL_SPECS:
        known = ", ".join([*MODEL_SPECS, *PRETRAINED])
        raise InvalidRequest(f"unknown local model {name!r}; known: {known}", field="model")
    return MODEL_SPECS[name]


def ensure_model_dir(name: str, cache_dir: Path) -> Path:
    """The cached folder of a named model: a toy one made by ``polar model init``'s code, a pretrained one
    fetched by ``polar model fetch``'s, on first use."""
    if name in PRETRAINED:
        return fetch_model(name, cache_dir)
    spec = get_spec(name)
    out = cache_dir / "models" / spec.key
    if not (out / "model.safetensors").exists():
        init_model_folder(spec, out, cache_dir)
    return out


def named_tokenizer(name: str, cache_dir: Path) -> ChatTokenizer:
    """The tokenizer of a named model (a toy one's without building its weights)."""
    from polar.model_folder import folder_tokenizer, open_model_folder
    from polar.tokens.tokenizer import load_tokenizer

    if name in PRETRAINED:
        return folder_tokenizer(open_model_folder(fetch_model(name, cache_dir)))
    return load_tokenizer(get_spec(name).tokenizer, cache_dir)
