"""The ``vlm`` draft kind: a small VLM of a supported family (or the target itself) that sees the images."""

from __future__ import annotations

from typing import Any

from ...targets import family_by_model_type, family_of
from ..registry import DraftKind, register_draft_kind
from .drafter import VLMDrafter


def _loads(config: Any) -> "type | None":
    family = family_by_model_type(getattr(config, "model_type", ""))
    return None if family is None else family.model_class()


def _param_groups(draft: Any, stage: int, cfg: Any) -> list[dict]:
    """The language model and LM head; the vision tower and projector stay frozen (as LLaVA's stage 2)."""
    draft.requires_grad_(False)
    params = list(draft.get_decoder().parameters()) + list(draft.get_output_embeddings().parameters())
    for p in params:
        p.requires_grad_(True)
    return [{"params": params, "lr": cfg.lr}]


def _card_rows(draft: Any) -> str:
    vision = draft.config.vision_config
    params = sum(p.numel() for p in draft.parameters()) - sum(p.numel() for p in draft.get_decoder().parameters())
    return (f"| vision | {vision.model_type}, {vision.num_hidden_layers} layers, hidden {vision.hidden_size}; "
            f"{params:,} parameters outside the language model; reads the target's image inputs |\n")


VLM = register_draft_kind(DraftKind(
    name="vlm",
    title="vlm",
    drafter=VLMDrafter,
    claims=lambda draft: family_of(draft) is not None,
    priority=10,
    loads=_loads,
    training_view=lambda draft, vocab, stage: VLMDrafter(draft, vocab),
    param_groups=_param_groups,
    card_rows=_card_rows,
))

__all__ = ["VLM", "VLMDrafter"]
