"""The ``text_only`` draft kind: any causal LM with the target's text ids (the fallback kind)."""

from __future__ import annotations

from typing import Any

from ..registry import DraftKind, register_draft_kind
from .drafter import TextOnly, TextOnlyDrafter, runs_alone, text_only_view


def _loads(config: Any) -> "type | None":
    """``AutoModelForCausalLM``, except for transformers' ``*_assistant`` drafters (see :func:`runs_alone`)."""
    from transformers import AutoModelForCausalLM

    return None if str(getattr(config, "model_type", "")).endswith("_assistant") else AutoModelForCausalLM


def _param_groups(draft: Any, stage: int, cfg: Any) -> list[dict]:
    draft.requires_grad_(True)
    return [{"params": list(draft.parameters()), "lr": cfg.lr}]


TEXT_ONLY = register_draft_kind(DraftKind(
    name="text_only",
    title="text-only",
    drafter=TextOnlyDrafter,
    # asked last: any causal LM that drafts alone; a model no kind claims is refused, naming the kinds
    claims=lambda draft: isinstance(draft, TextOnly) or runs_alone(draft),
    priority=-100,
    loads=_loads,
    training_view=lambda draft, vocab, stage: TextOnlyDrafter(draft, vocab),
    param_groups=_param_groups,
    language_model=lambda draft: draft.model if isinstance(draft, TextOnly) else draft,
    build=lambda target, language_model, cfg, target_name: language_model,
))

__all__ = ["TEXT_ONLY", "TextOnly", "TextOnlyDrafter", "text_only_view"]
