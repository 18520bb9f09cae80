"""Train the small byte-level BPE used by fast tests (polar/assets/tokenizers/small/tokenizer.json).

Run once; the result is committed (the Python stdlib it trains on can change between versions).
Same normaliser and pre-tokeniser as Qwen2.5, same chat/tool added tokens, ~4k ids.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from polar.tokens.tokenizer import QWEN_PRETOKENIZE_PATTERN, SPECIAL_TOKENS, TEXT_ADDED_TOKENS


def main(out: Path, vocab_size: int = 4096) -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TEXT_ADDED_TOKENS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    tok.add_tokens(list(TEXT_ADDED_TOKENS))
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    print(f"{out}: {tok.get_vocab_size()} ids from {len(files)} files")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("polar/assets/tokenizers/small/tokenizer.json"))
