"""Runs an :class:`~hf_specmm.drafts.mtp.modeling.MtpDraft`: the feature head's drafter, with the prompt laid out
as vLLM's MTP proposer lays it out.

A feature head's slot t reads (x_t, f_{t-1}) at the position of x_t, and its first slot reads the first token
with a zero feature. An MTP layer reads pairs (f_t, x_{t+1}) only, each at the position of its feature t
(vLLM's ``qwen3_5_mtp.py`` / EAGLE proposer): so here each row's first prompt slot is a hole and every slot sits
one position back. The cache numbers every later slot by the count of slots before it, which is then exactly
that numbering (the pending pair (f(cur), next) at cur's position). transformers' ``MtpModel`` numbers a pair by
its token's position instead: one more everywhere, the same relative positions in a text prompt.

A draft of several MTP layers proposes with layer k at draft step k (step 0: the pending read; then one step per
drafted token or tree level), and with its last layer at every step past it (its own output fed back). Every layer
writes every slot, as transformers' ``MtpModel`` chains them: layer k's slot reads layer k - 1's output at the slot
before (so the slots of all layers share one numbering and one rollback); this drafter carries those outputs across
forwards (the pending read's last slot, each draft's, each tree node's parent's).

A layer with ``raw_embeddings`` (Inkling's, as transformers' ``MtpModel`` runs it) reads every prompt token
through the target's table without its embedding norm, image placeholders included, not the target's input
embeddings.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import IncompatibleDraftError
from ..feature_head.drafter import FeatureHeadDrafter


class MtpDrafter(FeatureHeadDrafter):
    """:class:`FeatureHeadDrafter` without the prompt's first slot, its slots at their features' positions."""

    step = 0  #: the round's draft step: which MTP layer proposes (the draft clamps it to its last layer)
    # with several MTP layers: layers 0 .. L-2's outputs at the last slot the pending read wrote ([B, 1, L-1, H]),
    # and every layer's at the last level read ([B, k, L, H]); ``before``: what the next forward's layers read
    true_before: torch.Tensor | None = None
    level_states: torch.Tensor | None = None
    before: torch.Tensor | None = None
    chained = True
    block_valid: torch.Tensor | None = None

    @property
    def layered(self) -> bool:
        return self.model.config.num_layers > 1

    def model_kwargs(self) -> dict[str, Any]:
        if not self.layered:
            return {}
        return {"step": self.step, "before": self.before, "valid": self.block_valid, "chained": self.chained}

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, valid: torch.Tensor | None,
                logits: bool = True, position_ids: torch.Tensor | None = None, tree_mask: Any = None,
                keep: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.block_valid, self.chained = (None if valid is None else valid.to(self.device)), tree_mask is None
        result = super().forward(features, embeds, valid, logits, position_ids, tree_mask, keep)
        if self.layered:
            self.level_states = self.model_output.layer_states[:, -keep:]
        return result

    @property
    def reads_target_embeddings(self) -> bool:
        return not self.model.config.raw_embeddings  # the layer embeds the prompt's ids itself

    def prefill(self, prompt: Any, first_tokens: torch.Tensor, new_cache: Any) -> None:
        self.step, self.before = 0, None
        super().prefill(prompt, first_tokens, new_cache)
        self.true_before = self.level_states[:, :, :-1] if self.layered else None

    def read_pending(self, cur: torch.Tensor) -> torch.Tensor:
        self.step, self.before = 0, self.true_before
        logits = super().read_pending(cur)
        self.true_before = self.level_states[:, :, :-1] if self.layered else None
        return logits

    def read_draft(self, token: torch.Tensor) -> torch.Tensor:
        self.step += 1
        self.before = self.level_states[:, :, :-1] if self.layered else None
        return super().read_draft(token)

    def read_level(self, tokens: torch.Tensor, parents: torch.Tensor, attention_mask: Any,
                   position_ids: torch.Tensor) -> torch.Tensor:
        self.step += 1
        if self.layered:  # each node's slot before is its parent's
            states = self.level_states
            index = parents.clamp_min(0).to(states.device)[..., None, None].expand(-1, -1, *states.shape[2:])
            self.before = states.gather(1, index)[:, :, :-1]
        return super().read_level(tokens, parents, attention_mask, position_ids)

    def select_rows(self, keep: torch.Tensor) -> None:
        if self.true_before is not None:
            self.true_before = self.true_before[keep.to(self.true_before.device)]
        self.level_states = self.before = None
        super().select_rows(keep)

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
