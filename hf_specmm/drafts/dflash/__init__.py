"""The ``dflash`` draft kind: DFlash block drafters (arXiv 2602.06036) as transformers ships them
(``MuseGlimmerAssistantModel``), one drafter forward per round for a whole block, on the target's features."""

from __future__ import annotations

from typing import Any

from ..registry import DraftKind, register_draft_kind
from .drafter import DFlashDrafter
from .formats import is_speculators_dflash, load_speculators_dflash, save_speculators_dflash
from .modeling import DFLASH_CLASSES, dflash_config_for, dflash_draft_for, is_dflash_draft, target_vocab_size


def _not_trainable(*args: Any) -> list[dict]:
    raise NotImplementedError("a DFlash drafter is not trainable with hf-specmm yet (training_view is None)")


def _no_loader(config: Any) -> "type | None":
    """Stock's classes load through their own ``AutoModel`` mapping."""
    return next((cls for cls in DFLASH_CLASSES if isinstance(config, cls.config_class)), None)


def _card_rows(draft: Any) -> str:
    config = draft.config
    return (f"| DFlash drafter | {config.num_hidden_layers} × {type(draft.layers[0]).__name__}; block {config.block_size}; "
            f"reads target layers {list(config.target_layer_ids)}; {sum(p.numel() for p in draft.parameters()):,} "
            "parameters |\n| needs | its target: uses that target's token embedding and LM head (not stored here) |\n")


DFLASH = register_draft_kind(DraftKind(
    name="dflash",
    title="DFlash",
    drafter=DFlashDrafter,
    claims=is_dflash_draft,
    priority=27,
    loads=_no_loader,
    training_view=None,  # not trainable yet: hf-specmm train refuses it before any work
    param_groups=_not_trainable,
    card_rows=_card_rows,
    target_vocab_size=target_vocab_size,
    block_drafter=True,
))

__all__ = ["DFLASH", "DFLASH_CLASSES", "DFlashDrafter", "dflash_config_for", "dflash_draft_for", "is_dflash_draft",
           "is_speculators_dflash", "load_speculators_dflash", "save_speculators_dflash"]
