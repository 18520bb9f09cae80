"""The ``local`` backend: the in-process engine behind the Backend protocol (the embedded default)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import torch

from polar.inference import GenerateChunk, GenerateRequest, GenerateResult, LogprobSemantics, WeightUpdate, collect
from polar.model_folder import folder_tokenizer, open_model_folder
from polar.models.engine import LocalEngine
from polar.models.tiny import ensure_model_dir


class LocalBackend:
    name = "local"

    def __init__(self, engine: LocalEngine):
        self.engine = engine

    @classmethod
    def from_spec(
        cls,
        model: str,
        cache_dir: Path,
        *,
        threads: int = 1,
        semantics: LogprobSemantics = LogprobSemantics.TEMPERATURE_SCALED,
    ) -> LocalBackend:
        return cls.from_folder(ensure_model_dir(model, cache_dir), threads=threads, semantics=semantics)

    @classmethod
    def from_folder(
        cls, path: Path, *, threads: int = 1, semantics: LogprobSemantics = LogprobSemantics.TEMPERATURE_SCALED
    ) -> LocalBackend:
        """The model folder ``path`` (weights, config and tokenizer) in this process."""
        folder = open_model_folder(path)
        return cls(LocalEngine(folder.path, folder_tokenizer(folder), threads=threads, semantics=semantics))

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await collect(self.stream(request))

    def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        return self.engine.stream(request)

    async def weight_version(self) -> str:
        return self.engine.weight_version

    async def load_weights(self, source: Path | dict[str, torch.Tensor], version: str) -> None:
        await self.engine.load_weights(source, version)

    async def update_weights(self, update: WeightUpdate) -> None:
        """Swap weights between two decode steps (the engine never aborts running generations for it)."""
        source = update.tensors if update.tensors is not None else Path(update.path) if update.path else None
        if source is None:
            await self.engine.relabel(update.version)
        else:
            await self.engine.load_weights(source, update.version)

    async def aclose(self) -> None:
        self.engine.close()
