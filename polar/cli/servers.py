"""The long-running services: ``polar serve-model`` (the SGLang-compatible model server, whose flags
``polar.serving.launch`` defines), ``polar gateway`` (the model API gateway) and ``polar serve`` (the control API,
with its inline flows and the embedded gateway)."""

from __future__ import annotations

import argparse
from pathlib import Path

from polar.settings import get_settings


def _gateway(args: argparse.Namespace) -> None:
    from polar.models.process import use_model_path
    from polar.proxy.server import serve_gateway

    use_model_path(args.model_path)
    settings = get_settings()
    host, port = args.host or settings.gateway_host, args.port or settings.gateway_port
    if args.workers > 1:
        from polar.proxy.server import run_workers

        extra = ["--model-path", str(args.model_path)] if args.model_path else []
        raise SystemExit(run_workers(settings, host, port, args.workers, extra))
    import uvloop  # the gateway's loop: bench_gateway_scale measures it against asyncio's

    uvloop.run(serve_gateway(settings, host, port, reuse_port=args.reuse_port))


def _serve(args: argparse.Namespace) -> None:
    from flows.prefect_server import temporary_server
    from polar.api import serve
    from polar.models.check import checked_model
    from polar.models.process import use_model_path
    from polar.models.resolve import ModelChoice

    use_model_path(args.model_path)
    settings = get_settings()
    checked_model(ModelChoice.policy(settings))  # the policy model and its server agree, or nothing starts
    if settings.judge_url or settings.judge_model_path:
        checked_model(ModelChoice.judge(settings))
    with temporary_server(settings):  # before the first flow: one server, stopped when serving ends
        from flows.dispatch import run_inline
        from polar.proxy.embedded import start_embedded

        serve(host=args.host, port=args.port, run_inline=run_inline, start_gateway=start_embedded)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from polar.serving import launch

    serve_model = sub.add_parser("serve-model", help="serve the local model with SGLang's /generate wire format")
    launch.add_arguments(serve_model)
    serve_model.set_defaults(func=launch.run)

    gateway = sub.add_parser("gateway", help="the model API gateway (OpenAI, Anthropic, Gemini protocols)")
    gateway.add_argument("--host", help="default: POLAR_GATEWAY_HOST (127.0.0.1)")
    gateway.add_argument("--port", type=int, help="default: POLAR_GATEWAY_PORT (8700)")
    gateway.add_argument("--model-path", type=Path, help="the model's Hugging Face folder (POLAR_MODEL_PATH)")
    gateway.add_argument("--workers", type=int, default=1, help="gateway processes sharing the port (default 1)")
    gateway.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # a worker of --workers
    gateway.set_defaults(func=_gateway)

    api = sub.add_parser("serve", help="the control API: tasks, rollouts, trajectories, trainer claims, weights")
    api.add_argument("--host", help="default: POLAR_API_HOST (127.0.0.1)")
    api.add_argument("--port", type=int, help="default: POLAR_API_PORT (8800)")
    api.add_argument("--model-path", type=Path, help="the policy model's Hugging Face folder (POLAR_MODEL_PATH)")
    api.set_defaults(func=_serve)
