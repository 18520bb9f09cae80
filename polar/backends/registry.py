"""Backend registry: settings → a connected Backend. Core code never names a backend directly.

With ``POLAR_CAPTURE_EXTRAS`` every server is asked once, at connect, for those extras
(``polar.backends.extras.check_extras``): one that does not return them (a server started without the flag, a
router that drops it) stops the start with a ConfigError naming what is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from polar.errors import InvalidRequest
from polar.inference import Backend
from polar.settings import BackendKind, Settings

if TYPE_CHECKING:
    from polar.models.engine import LocalEngine
    from polar.models.moe_shape import MoEShape


async def _local(settings: Settings) -> Backend:
    from polar.backends.local import LocalBackend
    from polar.models.resolve import ModelChoice, resolve_model_folder

    folder = await asyncio.to_thread(resolve_model_folder, ModelChoice.policy(settings))
    return await _checked(LocalBackend.from_folder(folder.path, threads=settings.torch_threads), settings)


async def _checked(backend: Backend, settings: Settings) -> Backend:
    """``backend``, once it has shown it returns the capture extras the settings ask for (closed if not)."""
    try:
        await _check_extras(backend, settings)
    except BaseException:
        await backend.aclose()
        raise
    return backend


async def _check_extras(backend: Backend, settings: Settings) -> None:
    from polar.backends.extras import check_extras
    from polar.capture_extras import verified_options
    from polar.inference import ExtrasRequest

    wanted = verified_options(settings.capture_extras)
    if wanted.any:
        await check_extras(backend, ExtrasRequest(wanted.top_logprobs, wanted.routed_experts))


async def _routing_shape(settings: Settings) -> MoEShape | None:
    """The MoE routing shape of the served model (its folder's config.json), when routed experts are captured."""
    from polar.capture_extras import verified_options
    from polar.models.moe_shape import moe_shape
    from polar.models.resolve import ModelChoice, resolve_model_folder

    if not verified_options(settings.capture_extras).routed_experts:
        return None
    folder = await asyncio.to_thread(resolve_model_folder, ModelChoice.policy(settings))
    return moe_shape(folder.config)


def _require_url(settings: Settings) -> str:
    if not settings.backend_url:
        raise InvalidRequest(f"POLAR_BACKEND_URL is required for the {settings.backend} backend", field="backend_url")
    return settings.backend_url


def _sglang(settings: Settings) -> Callable[[str], Awaitable[Backend]]:
    from polar.backends.sglang import SGLangBackend

    async def connect(url: str) -> Backend:
        shape = await _routing_shape(settings)
        return await _checked(
            await SGLangBackend.connect(url, timeout_s=settings.backend_timeout_s, routing_shape=shape), settings
        )

    return connect


def _vllm(settings: Settings) -> Callable[[str], Awaitable[Backend]]:
    from polar.backends.vllm import VLLMBackend

    async def connect(url: str) -> Backend:
        return await _checked(
            await VLLMBackend.connect(url, endpoint=settings.vllm_endpoint, timeout_s=settings.backend_timeout_s),
            settings,
        )

    return connect


async def _served(settings: Settings, connector: Callable[[Settings], Callable[[str], Awaitable[Backend]]]) -> Backend:
    """One server, or a fleet (polar.backends.fleet) when POLAR_BACKEND_URL lists several."""
    from polar.backends.fleet import FleetBackend, parse_urls

    connect = connector(settings)
    urls = parse_urls(_require_url(settings))
    if len(urls) == 1:
        return await connect(urls[0])
    return await FleetBackend.connect(urls, connect, retry_after_s=settings.backend_retry_after_s)


BACKENDS: dict[BackendKind, Callable[[Settings], Awaitable[Backend]]] = {
    BackendKind.LOCAL: _local,
    BackendKind.SGLANG: lambda settings: _served(settings, _sglang),
    BackendKind.VLLM: lambda settings: _served(settings, _vllm),
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
