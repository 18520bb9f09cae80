"""The toy models of the tests and the embedded demo: named recipes for ``polar model init``.

Each name is a TinyModelSpec; its folder is made by the same code as ``polar model init`` the first time it is
asked for and cached under ``cache_dir/models``. Nothing else about a toy model is special: the gateway, the
judge and the exports read its folder like any model's (polar/models/folder.py).
"""

from __future__ import annotations

from pathlib import Path

from polar.errors import InvalidRequest
from polar.models.init import TinyModelSpec, init_model_folder

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
        raise InvalidRequest(f"unknown local model {name!r}; known: {', '.join(MODEL_SPECS)}", field="model")
    return MODEL_SPECS[name]


def ensure_model_dir(name: str, cache_dir: Path) -> Path:
    """The cached folder of a named toy model, made by ``polar model init``'s code on first use."""
    spec = get_spec(name)
    out = cache_dir / "models" / spec.key
    if not (out / "model.safetensors").exists():
        init_model_folder(spec, out, cache_dir)
    return out
