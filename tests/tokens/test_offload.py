"""Long texts tokenized in a child process (``polar.tokens.offload``): the same ids as the tokenizer itself gives,
and the caller tokenizes on its own whenever the child cannot answer (starting, busy, dead, or refusing a text)."""

from __future__ import annotations

import random
import time

import pytest

from polar.tokens.offload import TokenizerChild
from polar.tokens.tokenizer import load_tokenizer


def _ready(child: TokenizerChild, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    child.start_soon()
    while child.encode_batch(["warm up"]) is None:
        assert time.monotonic() < deadline, "the tokenizing child did not start"
        time.sleep(0.05)


@pytest.fixture
def child_of():
    children: list[TokenizerChild] = []

    def make(tokenizer, min_chars: int = 0) -> TokenizerChild:
        child = TokenizerChild(tokenizer.to_json(), min_chars=min_chars)
        children.append(child)
        return child

    yield make
    for child in children:
        child.close()


@pytest.mark.parametrize("name", ["small", "qwen"])
def test_the_child_gives_the_ids_the_tokenizer_gives(name, cache_dir, child_of):
    tokenizer = load_tokenizer(name, cache_dir)
    child = child_of(tokenizer)
    _ready(child)
    pieces = [
        "<|im_start|>",
        "<|im_end|>",
        " ",
        "\n",
        "a",
        "é",
        "e\u0301",
        "\u212b",
        "你好 🙂",
        "def f(x):\n    return x",
    ]
    rnd = random.Random(3)
    texts = ["".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 40))) for _ in range(300)]
    texts.append("".join(rnd.choice(pieces) for _ in range(60_000)))  # a long opening
    got = child.encode_batch(texts)
    assert got is not None and child.served >= 2
    assert [list(ids) for ids in got] == [tokenizer.encode(text) for text in texts]


def test_a_text_the_child_cannot_tokenize_is_left_to_the_caller(cache_dir, child_of):
    tokenizer = load_tokenizer("small", cache_dir)
    child = child_of(tokenizer)
    _ready(child)
    assert child.encode_batch(["a lone surrogate \ud800 here"]) is None  # the caller's own attempt decides
    assert child.encode_batch(["and the child answers the next one"]) is not None


def test_a_busy_or_dead_child_leaves_the_work_to_the_caller_and_is_replaced(cache_dir, child_of):
    tokenizer = load_tokenizer("small", cache_dir)
    child = child_of(tokenizer)
    _ready(child)
    assert child._busy.acquire()  # white-box: another caller's texts are in the child
    try:
        assert child.encode_batch(["busy"]) is None
    finally:
        child._busy.release()
    proc = child._proc
    assert proc is not None
    proc.kill()
    proc.wait()
    assert child.encode_batch(["dead"]) is None  # falls back, and a new child is on its way
    _ready(child)
    assert child._proc is not proc and list(child.encode_batch(["back"])[0]) == tokenizer.encode("back")


def test_a_tokenizer_sends_only_long_batches_to_its_child(cache_dir, child_of):
    """``ChatTokenizer.encode_batch`` uses the child for a batch of at least ``min_chars`` characters; a rendered
    opening tokenized that way gets exactly the ids of a tokenizer without one."""
    tokenizer = load_tokenizer("small", cache_dir)
    child = child_of(tokenizer, min_chars=10_000)
    _ready(child)
    served = child.served
    opening = (
        "<|im_start|>system\n" + "You read the repository. " * 800 + "<|im_end|>\n<|im_start|>user\nGo<|im_end|>\n"
    )
    tokenizer.offload = child
    try:
        short = tokenizer.encode_batch(["short text"])
        assert child.served == served and list(short[0]) == tokenizer.encode("short text")
        via_child = list(tokenizer.encode_rendered(opening))
        assert child.served == served + 1
    finally:
        tokenizer.offload = None
    assert via_child == tokenizer.encode(opening)
