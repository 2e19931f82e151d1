"""The ``image_adapter`` draft kind: a small LM plus an adapter from the target's own image embeddings."""

from __future__ import annotations

from typing import Any

import torch

from ..registry import DraftKind, register_draft_kind
from ..text_only import TextOnlyDrafter
from .configuration import ImageAdapterDraftConfig
from .drafter import ImageAdapterDrafter
from .modeling import ImageAdapter, ImageAdapterDraft, pool_image_features


def _param_groups(draft: ImageAdapterDraft, stage: int, cfg: Any) -> list[dict]:
    """Stage 1: the LM alone. Stage 2: the adapter at ``stage2_lr`` (default lr) and the LM at
    ``stage2_lm_lr`` (default lr / 3; 0 = frozen)."""
    draft.requires_grad_(False)
    if stage == 1:
        draft.language_model.requires_grad_(True)
        return [{"params": list(draft.language_model.parameters()), "lr": cfg.lr}]
    draft.adapter.requires_grad_(True)
    groups = [{"params": list(draft.adapter.parameters()), "lr": cfg.stage2_lr or cfg.lr}]
    lm_lr = cfg.lr / 3 if cfg.stage2_lm_lr is None else cfg.stage2_lm_lr
    if lm_lr > 0:
        draft.language_model.requires_grad_(True)
        groups.append({"params": list(draft.language_model.parameters()), "lr": lm_lr})
    return groups


def _build(target: Any, language_model: Any, cfg: Any, target_name: str | None) -> ImageAdapterDraft:
    with torch.random.fork_rng(devices=[]):  # the adapter's init depends on the seed only
        torch.manual_seed(cfg.seed + 1)
        return ImageAdapterDraft.for_target(target, language_model=language_model, image_pool=cfg.image_pool,
                                            target_name=target_name)


def _card_rows(draft: ImageAdapterDraft) -> str:
    params = sum(p.numel() for p in draft.adapter.parameters())
    return (f"| image adapter | {draft.config.image_feature_dim} → {draft.language_model.config.hidden_size}, "
            f"{params:,} parameters, visual tokens pooled ×{draft.config.image_pool} |\n")


IMAGE_ADAPTER = register_draft_kind(DraftKind(
    name="image_adapter",
    title="image-adapter",
    drafter=ImageAdapterDrafter,
    claims=lambda draft: isinstance(draft, ImageAdapterDraft),
    priority=20,
    loads=lambda config: ImageAdapterDraft if isinstance(config, ImageAdapterDraftConfig) else None,
    training_view=lambda draft, vocab, stage: (TextOnlyDrafter(draft.language_model, vocab) if stage == 1
                                               else ImageAdapterDrafter(draft, vocab)),
    param_groups=_param_groups,
    stages=(1, 2),
    language_model=lambda draft: draft.language_model,
    card_rows=_card_rows,
    build=_build,
))

__all__ = ["IMAGE_ADAPTER", "ImageAdapter", "ImageAdapterDraft", "ImageAdapterDraftConfig", "ImageAdapterDrafter",
           "pool_image_features"]
