"""The ``feature_head`` draft kind: an EAGLE-1 style head on the target's last hidden states."""

from __future__ import annotations

from typing import Any

import torch

from ..registry import DraftKind, register_draft_kind
from .configuration import FeatureHeadDraftConfig
from .drafter import FeatureHeadDrafter
from .losses import feature_head_loss
from .modeling import FeatureHeadDraft, target_fingerprint


def _param_groups(draft: FeatureHeadDraft, stage: int, cfg: Any) -> list[dict]:
    """The whole head in both stages (stage 2 at ``stage2_lr``, default lr); the target's embedding and LM
    head are the target's and stay frozen."""
    draft.requires_grad_(True)
    lr = cfg.lr if stage == 1 else (cfg.stage2_lr or cfg.lr)
    return [{"params": list(draft.parameters()), "lr": lr}]


def _build(target: Any, language_model: Any, cfg: Any, target_name: str | None) -> FeatureHeadDraft:
    """A fresh head with as many layers as the ``draft_config``'s ``num_hidden_layers`` (its width is the target's)."""
    with torch.random.fork_rng(devices=[]):  # the head's init depends on the seed only
        torch.manual_seed(cfg.seed + 2)
        return FeatureHeadDraft.for_target(target, num_layers=language_model.config.num_hidden_layers,
                                           target_name=target_name)


def _card_rows(draft: FeatureHeadDraft) -> str:
    text = draft.config.text_config
    layer = type(draft.body.layers[0]).__name__
    return (f"| feature head | fc {2 * text.hidden_size} → {text.hidden_size} + {draft.config.num_layers} × {layer}; "
            f"{sum(p.numel() for p in draft.parameters()):,} parameters; reads the target's last hidden states |\n"
            f"| needs | its target ({draft.config.target or draft.config.target_class}): uses that target's token "
            "embedding and LM head (not stored here; checked by a fingerprint when attached) |\n")


FEATURE_HEAD = register_draft_kind(DraftKind(
    name="feature_head",
    title="feature-head",
    drafter=FeatureHeadDrafter,
    claims=lambda draft: isinstance(draft, FeatureHeadDraft),
    priority=25,
    loads=lambda config: FeatureHeadDraft if isinstance(config, FeatureHeadDraftConfig) else None,
    training_view=lambda draft, vocab, stage: FeatureHeadDrafter(draft, vocab),
    param_groups=_param_groups,
    stages=(1, 2),
    language_model=lambda draft: draft,  # the card describes the head itself (its text config: the target's, its layers)
    card_rows=_card_rows,
    build=_build,
    loss=feature_head_loss,
))

__all__ = ["FEATURE_HEAD", "FeatureHeadDraft", "FeatureHeadDraftConfig", "FeatureHeadDrafter", "target_fingerprint"]
