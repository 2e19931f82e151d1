"""Random-weight models in the shapes of published checkpoints, and their left-padded synthetic prompts, for the bench
presets."""

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


def left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` [len(rows), longest] of the token rows, left-padded with ``pad_id``."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask
