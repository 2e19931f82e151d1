"""The ``mtp`` draft kind: a target checkpoint's own multi-token-prediction layer (Qwen3.5's ``mtp.*`` in vLLM's
layout, transformers' ``MtpLayer`` layout, Inkling's ``model.mtp.*``), read from the target's safetensors by
``hf_specmm.load_draft(<target>, kind="mtp", target=model)``, or made fresh and trained by
``hf-specmm train --draft-kind mtp``. It runs on the feature head's drafter (:mod:`.drafter`)."""

from __future__ import annotations

from typing import Any

import torch

from ..feature_head import _param_groups
from ..feature_head.losses import feature_head_loss
from ..feature_head.validation import check_head_config
from ..registry import DraftKind, register_draft_kind
from .drafter import MtpDrafter
from .layouts import read_mtp
from .modeling import MtpDraft, MtpDraftConfig
from .speculators import import_mtp, is_speculators_mtp


def _build(target: Any, language_model: Any, cfg: Any, target_name: str | None) -> MtpDraft:
    """A fresh MTP layer for ``target`` (its family's full-attention decoder layer, the target's width)."""
    with torch.random.fork_rng(devices=[]):  # the layer's init depends on the seed only
        torch.manual_seed(cfg.seed + 2)
        return MtpDraft.for_target(target, target_name=target_name)


def _import_speculators(folder: Any, target: Any, name: str | None = None) -> MtpDraft:
    return import_mtp(MtpDraft, folder, target, name)


_NORMS = {"layer": " + norm", "shared": " + shared norm", "none": ""}


def _layers_text(count: int, layer: str) -> str:
    if count == 1:
        return f"1 × {layer}, reused at every step"
    return f"{count} × ({layer}): draft step k runs layer k, every later step the last one"


def _card_rows(draft: MtpDraft) -> str:
    text, config = draft.config.text_config, draft.config
    layer = type(draft.body.layers[0]).__name__ + _NORMS[config.post_norm]
    read = f"read from {config.source} ({config.layout} layout)" if config.source else "trained by hf_specmm"
    inputs = ["norm(embedding)", "norm(feature)"][:: -1 if config.hidden_first else 1]
    return (f"| MTP layer | fc {2 * text.hidden_size} → {text.hidden_size} over [{'; '.join(inputs)}] + "
            f"{_layers_text(draft.config.num_layers, layer)}; {sum(p.numel() for p in draft.parameters()):,} "
            f"parameters; {read} |\n"
            f"| needs | its target ({config.target or config.target_class}): uses that target's token embedding and "
            "LM head (not stored here; checked by a fingerprint when attached) and its last hidden states |\n")


MTP = register_draft_kind(DraftKind(
    name="mtp",
    title="MTP",
    drafter=MtpDrafter,
    claims=lambda draft: isinstance(draft, MtpDraft),
    priority=27,  # before eagle3 / feature_head: an MtpDraft is a FeatureHeadDraft too
    loads=lambda config: MtpDraft if isinstance(config, MtpDraftConfig) else None,
    training_view=lambda draft, vocab, stage: MtpDrafter(draft, vocab),
    param_groups=_param_groups,
    stages=(1, 2),
    language_model=lambda draft: draft,
    card_rows=_card_rows,
    build=_build,
    loss=feature_head_loss,
    check_config=check_head_config,
    from_target_checkpoint=read_mtp,
    imports=lambda raw: _import_speculators if is_speculators_mtp(raw) else None,  # speculators' ``mtp`` layout
))


__all__ = ["MTP", "MtpDraft", "MtpDraftConfig", "MtpDrafter"]
