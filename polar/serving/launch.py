"""The launcher of the SGLang-compatible server (``python -m polar.serving``, mounted as ``polar serve-model``):
serve a local model with SGLang's native wire format.

``add_arguments`` / ``run`` let the ``polar`` command line (``polar.cli.servers``) mount this as a subcommand;
``main`` runs it alone. It stays in this package, not in ``polar.cli``, because ``python -m polar.serving`` runs it
and the library never imports the command line. Flags follow SGLang's names where one exists
(``--served-model-name``, ``--weight-version``, ``--incremental-streaming-output``); defaults come from
:class:`polar.settings.Settings`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from polar.settings import get_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    settings = get_settings()
    parser.add_argument("--model", default=settings.model, help="toy model name (polar.models.tiny)")
    parser.add_argument(
        "--model-path",
        type=Path,
        default=settings.model_path,
        help="the model's Hugging Face folder (POLAR_MODEL_PATH)",
    )
    parser.add_argument("--served-model-name", default=None, help="name in /v1/models (default: --model)")
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--threads", type=int, default=settings.torch_threads)
    parser.add_argument("--cache-dir", type=Path, default=settings.cache_dir)
    parser.add_argument("--incremental-streaming-output", action="store_true", help="stream deltas, not totals")
    parser.add_argument(
        "--enable-return-routed-experts",
        action="store_true",
        help="answer return_routed_experts (a MoE model); without it the flag is ignored, as in SGLang",
    )
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> None:
    from polar.model_folder import folder_tokenizer
    from polar.models.engine import LocalEngine
    from polar.models.resolve import ModelChoice, resolve_model_folder
    from polar.serving.sglang_app import serve

    folder = resolve_model_folder(ModelChoice(args.model_path, "", args.model, args.cache_dir, "--model-path"))
    engine = LocalEngine(
        folder.path, folder_tokenizer(folder), threads=args.threads, weight_version=args.weight_version
    )
    try:
        serve(
            args.host,
            args.port,
            engine,
            served_model_name=args.served_model_name or (folder.path.name if args.model_path else args.model),
            incremental_streaming=args.incremental_streaming_output,
            enable_return_routed_experts=args.enable_return_routed_experts,
            log_level=args.log_level,
        )
    finally:
        engine.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="polar serve-model", description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args(argv))
