"""A model as a Hugging Face folder: ``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` (with its
``chat_template``), optionally ``generation_config.json``.

``open_model_folder`` reads what Polar needs from it and fails with a ConfigError naming the missing piece;
``folder_tokenizer`` loads its tokenizer once per process (a 150k-id tokenizer.json takes about a second).
Everything that needs the model's tokenizer (gateway, judge, exports, ``polar generate``) goes through here.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polar.errors import ConfigError

if TYPE_CHECKING:
    from polar.tokens.tokenizer import ChatTokenizer

# Written by ``polar model init`` into config.json: the chat format of a tiny model whose architecture
# (always Qwen3 here) says nothing about the tokenizer it was given.
CHAT_FORMAT_KEY = "polar_chat_format"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field="model_path") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object", field="model_path")
    return data


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


@dataclass(frozen=True)
class ModelFolder:
    """What Polar reads from a model folder."""

    path: Path
    config: dict[str, Any] = field(repr=False)
    tokenizer_config: dict[str, Any] = field(repr=False)
    generation_config: dict[str, Any] = field(repr=False)

    @property
    def tokenizer_file(self) -> Path:
        return self.path / "tokenizer.json"

    @property
    def name(self) -> str:
        """The model's name as far as the folder tells it (``_name_or_path``, else the folder's name)."""
        value = self.config.get("_name_or_path") or self.tokenizer_config.get("name_or_path")
        return str(value) if value else self.path.name

    @property
    def architectures(self) -> tuple[str, ...]:
        return tuple(str(a) for a in self.config.get("architectures") or ())

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type") or "")

    @property
    def declared_chat_format(self) -> str:
        return str(self.config.get(CHAT_FORMAT_KEY) or "")

    @property
    def chat_template(self) -> str | None:
        template = self.tokenizer_config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if isinstance(template, str) and template:
            return template
        jinja = self.path / "chat_template.jinja"
        return jinja.read_text() if jinja.exists() else None

    @property
    def vocab_size(self) -> int | None:
        value = self.config.get("vocab_size")
        return value if isinstance(value, int) else None

    @property
    def context_length(self) -> int | None:
        value = self.config.get("max_position_embeddings")
        return value if isinstance(value, int) else None

    def eos_ids(self) -> tuple[int, ...]:
        """End-of-generation ids: generation_config's, else config's (both may hold one id or a list)."""
        return _ids(self.generation_config.get("eos_token_id")) or _ids(self.config.get("eos_token_id"))


def open_model_folder(path: Path | str) -> ModelFolder:
    """Read a model folder; ConfigError when it is not one (no folder, no config.json, no tokenizer.json)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ConfigError(f"model folder {path} does not exist (POLAR_MODEL_PATH / --model-path)", field="model_path")
    if not (path / "tokenizer.json").is_file():
        raise ConfigError(
            f"model folder {path} has no tokenizer.json; Polar needs the model's fast tokenizer file "
            "(save it with tokenizer.save_pretrained(folder))",
            field="model_path",
        )
    if not (path / "config.json").is_file():
        raise ConfigError(f"model folder {path} has no config.json", field="model_path")
    tokenizer_config = _read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").exists() else {}
    generation = path / "generation_config.json"
    return ModelFolder(
        path=path.resolve(),
        config=_read_json(path / "config.json"),
        tokenizer_config=tokenizer_config,
        generation_config=_read_json(generation) if generation.exists() else {},
    )


_tokenizers: dict[Path, ChatTokenizer] = {}
_lock = threading.Lock()


def folder_tokenizer(folder: ModelFolder) -> ChatTokenizer:
    """The folder's tokenizer (loaded once per process and folder), with the folder's end-of-generation ids."""
    from tokenizers import Tokenizer

    from polar.tokens.tokenizer import ChatTokenizer

    with _lock:
        if folder.path not in _tokenizers:
            try:
                tok = Tokenizer.from_file(str(folder.tokenizer_file))
            except Exception as exc:
                raise ConfigError(f"cannot load {folder.tokenizer_file}: {exc}", field="model_path") from exc
            _tokenizers[folder.path] = ChatTokenizer(
                tok, folder.name, folder.tokenizer_file, eos_ids=folder.eos_ids() or None
            )
        return _tokenizers[folder.path]
