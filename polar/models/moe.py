"""Mixture-of-experts models: the tiny Qwen3-MoE recipe, router capture and the reference computations.

A Qwen3-MoE decoder layer routes each position through ``mlp.gate`` (softmax over ``num_experts`` router
logits, then the top ``num_experts_per_tok``); ``RouterTap`` hooks every gate and hands back, after a forward
pass, the experts chosen for each fed position as a (positions, layers, k) array, as SGLang's routed-experts
capturer records them. ``routing_of`` and ``top_logprobs_of`` re-feed a whole sequence without a cache: what
a trajectory's stored routing and top-k must equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from polar.inference import LogprobSemantics
from polar.models.moe_shape import MoEShape, moe_shape

# A router whose logits spread over several units: top-k choices then have clear margins, so a decode step
# (one position, cached keys) and a whole-sequence forward choose the same experts despite float rounding.
ROUTER_INIT_STD = 0.4


def moe_model(config_kwargs: dict[str, Any], *, num_experts: int, top_k: int, seed: int) -> Any:
    """A seeded Qwen3-MoE causal LM: every layer sparse (router + ``num_experts`` experts), fp32."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **config_kwargs,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=config_kwargs["intermediate_size"],
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        output_router_logits=False,
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for gate in _gates(model):
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=generator) * ROUTER_INIT_STD)
    return model


def _gates(model: Any) -> list[Any]:
    """Each layer's router (``mlp.gate`` returning (logits, weights, indices)), in layer order."""
    return [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]


class RouterTap:
    """Records the experts every router chose during a forward pass (hooks stay on; recording is switched).

    Used from one thread (the engine's worker): ``start()``, run the forward, then ``take()`` the
    (positions, layers, k) array of that pass.
    """

    def __init__(self, model: Any, shape: MoEShape):
        self.shape = shape
        self._layers: list[torch.Tensor | None] | None = None
        gates = _gates(model)
        if len(gates) != shape.layers:
            raise ValueError(f"the model has {len(gates)} routers for {shape.layers} layers")
        for index, gate in enumerate(gates):
            gate.register_forward_hook(self._hook(index))

    def _hook(self, index: int) -> Callable[[Any, Any, Any], None]:
        def record(_module: Any, _inputs: Any, output: Any) -> None:
            if self._layers is not None:
                self._layers[index] = output[2].detach()

        return record

    def start(self) -> None:
        self._layers = [None] * self.shape.layers

    def take(self) -> np.ndarray:
        """The experts of the pass since ``start()``: (positions, layers, k), in the shape's dtype."""
        layers, self._layers = self._layers, None
        if layers is None or any(t is None for t in layers):
            raise RuntimeError("no complete forward pass was recorded")
        stacked = torch.stack([t for t in layers if t is not None], dim=1)  # (positions, layers, k)
        return stacked.numpy().astype(self.shape.dtype)

    def stop(self) -> None:
        self._layers = None


def logprob_rows(logits: torch.Tensor, temperature: float, semantics: LogprobSemantics, greedy: bool) -> torch.Tensor:
    """Log-probabilities with the sampled id's semantics (polar.models.sampling): scaled by the temperature when
    sampling under TEMPERATURE_SCALED, raw otherwise. ``logits`` is (..., vocab)."""
    logits = logits.float()
    if semantics is LogprobSemantics.TEMPERATURE_SCALED and not greedy:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def top_k_of(logprobs: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely ids per row (ties by lower id, as torch.topk on CPU) and their logprobs."""
    values, ids = torch.topk(logprobs, k, dim=-1)
    return ids.numpy().astype(np.int32), values.numpy().astype(np.float32)


def routing_of(model: Any, ids: list[int], shape: MoEShape) -> np.ndarray:
    """The experts of every position of ``ids`` in one uncached forward pass: (len(ids), layers, k)."""
    tap = _tap_of(model, shape)
    tap.start()
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=1)
        return tap.take()
    finally:
        tap.stop()


def top_logprobs_of(
    model: Any,
    ids: list[int],
    prompt_len: int,
    k: int,
    temperature: float,
    semantics: LogprobSemantics = LogprobSemantics.TEMPERATURE_SCALED,
) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced top-k (ids, logprobs) at the positions predicting ``ids[prompt_len:]``."""
    keep = len(ids) - prompt_len + 1
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=keep).logits[0, :-1]
    rows = logprob_rows(logits, temperature, semantics, greedy=temperature < 1e-6)
    return top_k_of(rows, k)


def _tap_of(model: Any, shape: MoEShape) -> RouterTap:
    """One tap per model object, kept on it (its hooks are added once)."""
    tap = getattr(model, "_polar_router_tap", None)
    if tap is None:
        tap = RouterTap(model, shape)
        model._polar_router_tap = tap
    return tap


def tap_for(model: Any) -> RouterTap | None:
    """The model's router tap, or None for a dense model."""
    shape = moe_shape(model.config)
    return _tap_of(model, shape) if shape is not None else None


def replayed_logprobs(
    model: Any,
    ids: list[int],
    experts: np.ndarray,
    prompt_len: int,
    temperature: float,
    semantics: LogprobSemantics = LogprobSemantics.TEMPERATURE_SCALED,
) -> list[float]:
    """Rollout routing replay: teacher-forced logprobs of ``ids[prompt_len:]`` with every router forced to the
    stored ``experts`` (positions x layers x k; rows past its end route freely), as a trainer replaying R3 does.
    Equal to the captured logprobs when the stored routing is the one the server used."""
    gates = _gates(model)
    forced = torch.as_tensor(np.asarray(experts, dtype=np.int64))
    handles = []

    def force(layer: int) -> Callable[[Any, Any, Any], Any]:
        def hook(module: Any, _inputs: Any, output: Any) -> Any:
            logits, _weights, indices = output
            indices = indices.clone()
            rows = min(len(forced), len(indices))
            indices[:rows] = forced[:rows, layer]
            probs = torch.softmax(logits, dim=-1, dtype=torch.float)
            weights = probs.gather(1, indices)
            if module.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(logits.dtype), indices

        return hook

    for layer, gate in enumerate(gates):
        handles.append(gate.register_forward_hook(force(layer)))
    try:
        keep = len(ids) - prompt_len + 1
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=keep).logits[0, :-1]
    finally:
        for handle in handles:
            handle.remove()
    rows = logprob_rows(logits, temperature, semantics, greedy=temperature < 1e-6)
    return rows.gather(1, torch.tensor(ids[prompt_len:])[:, None])[:, 0].tolist()
