"""Controlled acceptance for systems benchmarks.

Random weights give no meaningful acceptance. This wrapper runs the real draft forward (its real
cost) and then overrides the proposal at the last position: with probability α it is the target's
reference token (from a plain greedy run), otherwise a wrong token. Each proposal is an independent
Bernoulli(α), so for greedy decoding the expected tokens per round is τ = (1 − α^(γ+1)) / (1 − α).
This is a SYSTEMS benchmark: real acceptance comes from trained drafts.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class _ControlledAcceptanceMixin:
    """Mixed into the draft's own class so stock ``assistant_model.generate()`` works on it too."""

    alpha: float
    reference: torch.Tensor  # [B, R] the target's greedy continuation per row
    prompt_positions: torch.Tensor  # [B] draft position of the first generated token, per row
    wrong_modulus: int
    generator: torch.Generator

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: Any = None,
                logits_to_keep: int | torch.Tensor = 0, **kwargs: Any) -> Any:
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask,  # type: ignore[misc]
                              position_ids=position_ids, past_key_values=past_key_values,
                              logits_to_keep=logits_to_keep, **kwargs)
        batch, width = input_ids.shape
        last = position_ids[:, -1] if position_ids is not None else torch.full((batch,), past + width - 1)
        index = last.to(self.reference.device) + 1 - self.prompt_positions  # generated token being predicted
        length = self.reference.shape[1]
        ref = self.reference.gather(1, index.clamp(0, length - 1)[:, None]).squeeze(1)
        hit = torch.rand(batch, generator=self.generator) < self.alpha
        wrong = (ref + 1) % self.wrong_modulus
        token = torch.where(hit & (index >= 0) & (index < length), ref, wrong)
        logits = out.logits
        last_logits = torch.full_like(logits[:, -1], -1e4)
        last_logits.scatter_(1, token[:, None].to(logits.device), 1e4)
        logits[:, -1] = last_logits
        return out


def controlled_acceptance(draft: Any, alpha: float, seed: int = 0, wrong_modulus: int | None = None) -> Any:
    """A view of ``draft`` (same weights, same cost) whose proposals are right with probability ``alpha``.

    Call :func:`set_reference` before each generate call.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {alpha}")
    cls = type(draft)
    wrapped_cls = type(f"ControlledAcceptance{cls.__name__}", (_ControlledAcceptanceMixin, cls), {})
    wrapped = copy.copy(draft)  # shares parameters and submodules; own plain attributes
    wrapped.__class__ = wrapped_cls
    wrapped.alpha = alpha
    wrapped.generator = torch.Generator().manual_seed(seed)
    wrapped.wrong_modulus = wrong_modulus or draft.config.get_text_config().vocab_size
    return wrapped


def set_reference(draft: Any, reference: torch.Tensor, prompt_positions: torch.Tensor, seed: int | None = None) -> None:
    """``reference`` [B, R] target greedy continuation; ``prompt_positions`` [B] where generation starts."""
    draft.reference = reference.cpu()
    draft.prompt_positions = prompt_positions.cpu()
    if seed is not None:
        draft.generator.manual_seed(seed)
