"""Runs an :class:`~hf_specmm.drafts.mtp.modeling.MtpDraft`: the feature head's drafter, with the prompt read as
an MTP layer was trained to read it.

A feature head's first prompt slot reads the first token with a zero feature; an MTP layer has no such slot
(vLLM and transformers feed it (f_t, x_{t+1}) pairs only, the first token never alone), so that slot is a hole
here. The slots sit at the target's position of their token (transformers' ``MtpModel`` numbering; vLLM
numbers each pair by its feature's position, one less everywhere: the same relative positions in text).
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import IncompatibleDraftError
from ..feature_head.drafter import FeatureHeadDrafter


class MtpDrafter(FeatureHeadDrafter):
    """:class:`FeatureHeadDrafter` without the prompt's first slot."""

    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        from .modeling import MtpDraft

        if not isinstance(draft, MtpDraft):
            raise IncompatibleDraftError(f"an mtp draft must be an MtpDraft, got {type(draft).__name__}")
        draft.check_target(target)

    def prompt_slots(self, valid: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
        """Every real token's slot but each row's first (which has no feature before it)."""
        real = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid
        first = (real.long().cumsum(1) == 1) & real
        return real & ~first
