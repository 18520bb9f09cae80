"""Backend registry: settings → a connected Backend. Core code never names a backend directly."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from polar.backends.base import Backend
from polar.errors import InvalidRequest
from polar.settings import BackendKind, Settings

if TYPE_CHECKING:
    from polar.models.engine import LocalEngine


async def _local(settings: Settings) -> Backend:
    from polar.backends.local import LocalBackend
    from polar.models.resolve import ModelChoice, resolve_model_folder

    folder = await asyncio.to_thread(resolve_model_folder, ModelChoice.policy(settings))
    return LocalBackend.from_folder(folder.path, threads=settings.torch_threads)


def _require_url(settings: Settings) -> str:
    if not settings.backend_url:
        raise InvalidRequest(f"POLAR_BACKEND_URL is required for the {settings.backend} backend", field="backend_url")
    return settings.backend_url


async def _sglang(settings: Settings) -> Backend:
    from polar.backends.sglang import SGLangBackend

    return await SGLangBackend.connect(_require_url(settings), timeout_s=settings.backend_timeout_s)


async def _vllm(settings: Settings) -> Backend:
    from polar.backends.vllm import VLLMBackend

    return await VLLMBackend.connect(
        _require_url(settings), endpoint=settings.vllm_endpoint, timeout_s=settings.backend_timeout_s
    )


BACKENDS: dict[BackendKind, Callable[[Settings], Awaitable[Backend]]] = {
    BackendKind.LOCAL: _local,
    BackendKind.SGLANG: _sglang,
    BackendKind.VLLM: _vllm,
}


async def make_backend(settings: Settings) -> Backend:
    return await BACKENDS[settings.backend](settings)


def scripted_scorer(settings: Settings, backend: Backend, model_dir: Path | None = None) -> LocalEngine:
    """The local model that scores a scripted policy's replies: the backend's own engine when the backend is the
    local one (one model in memory), else the model folder ``model_dir``, else the configured toy model."""
    from polar.backends.local import LocalBackend

    if isinstance(backend, LocalBackend):
        return backend.engine
    if model_dir is not None:
        return LocalBackend.from_folder(model_dir, threads=settings.torch_threads).engine
    return LocalBackend.from_spec(settings.model, settings.cache_dir, threads=settings.torch_threads).engine
