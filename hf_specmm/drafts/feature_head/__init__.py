"""The ``feature_head`` draft kind: an EAGLE-1 style head on the target's last hidden states, and its
``eagle3`` variant (registered as the kind ``eagle3``): an EAGLE-3 head on three of the target's layers."""

from __future__ import annotations

from typing import Any

import torch

from ..registry import DraftKind, register_draft_kind
from .configuration import FeatureHeadDraftConfig
from .drafter import FeatureHeadDrafter
from .eagle3 import Eagle3FeatureHead
from .eagle3_config import Eagle3HeadConfig
from .eagle3_drafter import Eagle3Drafter
from .formats import checkpoint_format, import_head
from .losses import eagle3_loss, feature_head_loss
from .modeling import FeatureHeadDraft, target_fingerprint
from .validation import check_head_config


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
    check_config=check_head_config,
))

def _build_eagle3(target: Any, language_model: Any, cfg: Any, target_name: str | None) -> Eagle3FeatureHead:
    """A fresh EAGLE-3 head: the ``draft_config``'s layer count, ``cfg.aux_layers`` / ``cfg.draft_vocab_size``
    (the vocabulary itself is chosen from the answers once they are known: ``select_draft_vocab``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 2)
        return Eagle3FeatureHead.for_target(target, num_layers=language_model.config.num_hidden_layers,
                                            target_name=target_name, aux_layers=getattr(cfg, "aux_layers", None),
                                            draft_vocab_size=getattr(cfg, "draft_vocab_size", None))


def _eagle3_card_rows(draft: Eagle3FeatureHead) -> str:
    config = draft.config
    hidden, aux = config.layer_config.hidden_size, config.aux_layers
    return (f"| EAGLE-3 head | fc {len(aux) * hidden} → {hidden} over the inputs of target layers {aux}; "
            f"{config.layer_config.num_hidden_layers} × LlamaDecoderLayer (the first reads [embedding; feature]); "
            f"LM head over a {config.draft_vocab_size:,}-id draft vocabulary (d2t / t2d); "
            f"{sum(p.numel() for p in draft.parameters()):,} parameters |\n"
            f"| needs | its target ({config.target or config.target_class}): uses that target's token embedding "
            "(not stored here) and its hidden states |\n"
            "| serving | `save_pretrained(path, format=\"speculators\")` (vLLM) or `format=\"sglang\"` (SGLang) |\n")


EAGLE3 = register_draft_kind(DraftKind(
    name="eagle3",
    title="EAGLE-3 feature-head",
    drafter=Eagle3Drafter,
    claims=lambda draft: isinstance(draft, Eagle3FeatureHead),
    priority=26,  # before feature_head: an Eagle3FeatureHead is a FeatureHeadDraft too
    loads=lambda config: Eagle3FeatureHead if isinstance(config, Eagle3HeadConfig) else None,
    training_view=lambda draft, vocab, stage: Eagle3Drafter(draft, vocab),
    param_groups=_param_groups,
    stages=(1, 2),
    language_model=lambda draft: draft,
    card_rows=_eagle3_card_rows,
    build=_build_eagle3,
    loss=eagle3_loss,
    check_config=check_head_config,
    imports=lambda raw: import_head if checkpoint_format(raw) is not None else None,  # speculators / SGLang layouts
))


def _register_auto_class() -> None:
    """``AutoConfig`` / ``AutoModelForCausalLM`` load a saved EAGLE-3 head (no remote code)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        AutoConfig.register(Eagle3HeadConfig.model_type, Eagle3HeadConfig)
        AutoModelForCausalLM.register(Eagle3HeadConfig, Eagle3FeatureHead)
    except ValueError:  # already registered (module reloaded)
        pass


_register_auto_class()

__all__ = ["EAGLE3", "Eagle3Drafter", "Eagle3FeatureHead", "Eagle3HeadConfig", "FEATURE_HEAD", "FeatureHeadDraft", "FeatureHeadDraftConfig", "FeatureHeadDrafter", "target_fingerprint"]
