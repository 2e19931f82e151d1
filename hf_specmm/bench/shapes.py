"""Random-weight models in the shapes of published checkpoints, for the bench presets."""

from __future__ import annotations

from typing import Any

import torch


def random_weights(model_class: type, config: Any, dtype: torch.dtype, device: str,
                   pad_token_id: int | None = None) -> Any:
    """``model_class(config)`` built directly on ``device`` (no CPU copy of a 7B model first), in ``dtype``, in
    eval mode. Random weights rarely write EOS at a fixed step: no EOS, so every call runs to max_new_tokens."""
    with torch.device(device):
        model = model_class(config)
    model = model.to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = pad_token_id
    return model
