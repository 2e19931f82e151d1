"""Runs an :class:`~hf_specmm.drafts.mtp.modeling.MtpDraft`: the feature head's drafter, with the prompt laid out
as vLLM's MTP proposer lays it out.

A feature head's slot t reads (x_t, f_{t-1}) at the position of x_t, and its first slot reads the first token
with a zero feature. An MTP layer reads pairs (f_t, x_{t+1}) only, each at the position of its feature t
(vLLM's ``qwen3_5_mtp.py`` / EAGLE proposer): so here each row's first prompt slot is a hole and every slot sits
one position back. The cache numbers every later slot by the count of slots before it, which is then exactly
that numbering (the pending pair (f(cur), next) at cur's position). transformers' ``MtpModel`` numbers a pair by
its token's position instead: one more everywhere, the same relative positions in a text prompt.

A draft of several MTP layers proposes with layer k at draft step k (step 0: the pending read; then one step per
drafted token or tree level), and with its last layer at every step past it; every layer reads every slot.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import IncompatibleDraftError
from ..feature_head.drafter import FeatureHeadDrafter


class MtpDrafter(FeatureHeadDrafter):
    """:class:`FeatureHeadDrafter` without the prompt's first slot, its slots at their features' positions."""

    step = 0  #: the round's draft step: which MTP layer proposes (the draft clamps it to its last layer)

    def model_kwargs(self) -> dict[str, Any]:
        return {"step": self.step} if self.model.config.num_layers > 1 else {}

    def read_pending(self, cur: torch.Tensor) -> torch.Tensor:
        self.step = 0
        return super().read_pending(cur)

    def read_draft(self, token: torch.Tensor) -> torch.Tensor:
        self.step += 1
        return super().read_draft(token)

    def read_level(self, tokens: torch.Tensor, parents: torch.Tensor, attention_mask: Any,
                   position_ids: torch.Tensor) -> torch.Tensor:
        self.step += 1
        return super().read_level(tokens, parents, attention_mask, position_ids)

    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        from .modeling import MtpDraft

        if not isinstance(draft, MtpDraft):
            raise IncompatibleDraftError(f"an mtp draft must be an MtpDraft, got {type(draft).__name__}")
        draft.check_target(target)

    def prompt_slots(self, valid: torch.Tensor | None, ids: torch.Tensor,
                     positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every real token's slot but each row's first (no feature before it), at the previous token's position
        (``positions`` [..., B, L]: 1-D or M-RoPE's four rows)."""
        real = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid
        first = (real.long().cumsum(1) == 1) & real
        shifted = torch.cat([positions[..., :1], positions[..., :-1]], -1)
        return real & ~first, shifted
