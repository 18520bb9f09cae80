"""What a mixture-of-experts model routes per position (its shape), read from its config without loading torch:
the backends and the gateway need it to size and check routed-experts arrays, and a gateway in front of an
engine server never loads a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MoEShape:
    """What a routed-experts array holds per position: ``layers`` x ``top_k`` ids below ``num_experts``."""

    layers: int
    top_k: int
    num_experts: int

    @property
    def dtype(self) -> np.dtype:
        """The narrowest unsigned type that holds every expert id (uint8 up to 256 experts)."""
        return np.dtype(np.uint8) if self.num_experts <= 256 else np.dtype(np.uint16)


def moe_shape(config: dict[str, Any] | Any) -> MoEShape | None:
    """The routing shape a model config declares (Qwen-MoE's ``num_experts``, DeepSeek's ``n_routed_experts``),
    or None for a dense model."""
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    experts = get("num_experts") or get("n_routed_experts") or get("num_local_experts")
    top_k = get("num_experts_per_tok")
    layers = get("num_hidden_layers")
    if not experts or not top_k or not layers:
        return None
    return MoEShape(int(layers), int(top_k), int(experts))
