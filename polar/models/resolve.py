"""Which model folder a component uses: the one helper behind the gateway, the judge, the exports and
``polar generate`` (so none of them looks a tokenizer up anywhere else).

In order: an explicit folder (``POLAR_MODEL_PATH`` / ``--model-path``); else, with a remote server, the folder
the server says it serves (SGLang's ``/model_info`` ``tokenizer_path`` or ``model_path``, vLLM's ``/v1/models``
``root``) when that folder exists on this machine; else, with no server, the toy model ``POLAR_MODEL`` names.
A remote server whose folder is not here is a ConfigError that says what to set.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from polar.errors import ConfigError
from polar.model_folder import ModelFolder, open_model_folder
from polar.settings import BackendKind, Settings


@dataclass(frozen=True)
class ModelChoice:
    """What names one model: a folder, or a server to ask, or a toy model to build."""

    model_path: Path | None
    backend_url: str
    toy_model: str
    cache_dir: Path
    setting: str = "POLAR_MODEL_PATH"  # named in errors

    @property
    def backend_urls(self) -> list[str]:
        """Every server ``backend_url`` names (a fleet lists several, comma-separated)."""
        return [url.strip() for url in self.backend_url.split(",") if url.strip()]

    def served_name(self, folder: ModelFolder) -> str:
        """The name to list for the model: the folder's name when a folder or server named it, else the toy's."""
        return folder.path.name if self.model_path is not None or self.backend_url else self.toy_model

    @classmethod
    def judge(cls, settings: Settings) -> ModelChoice:
        return replace(cls.policy(judge_settings(settings)), setting="POLAR_JUDGE_MODEL_PATH")

    @classmethod
    def policy(cls, settings: Settings) -> ModelChoice:
        # The in-process backend has no server to ask, whatever POLAR_BACKEND_URL says.
        url = "" if settings.backend is BackendKind.LOCAL else settings.backend_url
        return cls(settings.model_path, url, settings.model, settings.cache_dir)


def judge_settings(settings: Settings) -> Settings:
    """The settings the LLM judge connects with: POLAR_JUDGE_* when any is set; else the policy's, but only for
    the embedded local model (a remote policy is not silently reused as its own judge)."""
    if settings.judge_url or settings.judge_model_path or settings.judge_backend:
        backend = settings.judge_backend or (BackendKind.LOCAL if not settings.judge_url else settings.backend)
        return settings.model_copy(
            update={"backend": backend, "backend_url": settings.judge_url, "model_path": settings.judge_model_path}
        )
    if settings.backend is BackendKind.LOCAL:
        return settings
    raise ConfigError(
        "the llm_judge needs its own model when the policy is served remotely: set POLAR_JUDGE_URL and "
        "POLAR_JUDGE_BACKEND (sglang or vllm), and POLAR_JUDGE_MODEL_PATH unless the server reports its folder",
        field="judge_url",
    )


def _json(client: httpx.Client, url: str) -> dict[str, Any] | None:
    try:
        response = client.get(url)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        data = response.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def reported_model_paths(base_url: str, timeout_s: float = 10.0) -> list[str]:
    """The folders a server says it serves, best first (empty when it says none or cannot be reached)."""
    base = base_url.rstrip("/")
    paths: list[str] = []
    with httpx.Client(timeout=timeout_s) as client:
        info = _json(client, base + "/model_info") or {}
        for key in ("tokenizer_path", "model_path"):
            if isinstance(info.get(key), str) and info[key]:
                paths.append(info[key])
        models = _json(client, base + "/v1/models") or {}
        for entry in models.get("data") or []:
            if isinstance(entry, dict) and isinstance(entry.get("root"), str) and entry["root"]:
                paths.append(entry["root"])
    return paths


def resolve_model_folder(choice: ModelChoice) -> ModelFolder:
    """The model folder of ``choice`` (see the module docstring); ConfigError when there is none."""
    if choice.model_path is not None:
        return open_model_folder(choice.model_path)
    if choice.backend_url:
        reported = [path for url in choice.backend_urls for path in reported_model_paths(url)]
        for path in reported:
            if (Path(path) / "tokenizer.json").is_file():
                return open_model_folder(path)
        said = (
            f"it reports {', '.join(repr(p) for p in reported)}, not a folder here" if reported else "it reports none"
        )
        raise ConfigError(
            f"cannot tell which model {choice.backend_url} serves ({said}); set {choice.setting} to a local copy of "
            "the served model's folder (config.json, tokenizer.json, tokenizer_config.json)",
            field="model_path",
        )
    from polar.models.tiny import ensure_model_dir

    return open_model_folder(ensure_model_dir(choice.toy_model, choice.cache_dir))
