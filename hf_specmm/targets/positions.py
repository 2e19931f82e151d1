"""Position rules: where a block of new tokens sits in a model's rotary positions.

A rule is the one place that numbers tokens, for the target's verification block, for a draft's
tokens after a rollback and for the teacher-forced training batches, so inference and training
cannot drift apart. Slots marked invalid (left padding, holes left by a rollback) take the position of
the next valid token; they are masked out of attention, so their own position is never read.
"""

from __future__ import annotations

import torch


class Rope1D:
    """1-D rotary positions (LLaVA's Llama/Qwen2/Mistral LMs): a token's position is the number of valid
    slots before it, which is how plain ``generate`` numbers left-padded prompts (``cumsum(mask) - 1``)."""

    name = "1d"

    def block_positions(self, start: torch.Tensor, valid: torch.Tensor | None, width: int) -> torch.Tensor:
        """Positions [B, width] of ``width`` new slots after ``start`` [B] valid ones (``valid`` [B, width] or None = all)."""
        if valid is None:
            return start[:, None] + torch.arange(width, device=start.device)
        valid = valid.long()
        return start[:, None] + valid.cumsum(-1) - valid

    def prompt_positions(self, mask: torch.Tensor) -> torch.Tensor:
        """Positions [B, L] of a left-padded prompt (or ``[prompt | answer]`` training row) with ``mask`` [B, L]."""
        return self.block_positions(mask.new_zeros(mask.shape[0]), mask, mask.shape[1])


ROPE_1D = Rope1D()
