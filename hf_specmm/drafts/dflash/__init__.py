"""The ``dflash`` draft kind: DFlash block drafters (arXiv 2602.06036) as transformers ships them
(``MuseGlimmerAssistantModel``), one drafter forward per round for a whole block, on the target's features."""

from __future__ import annotations

from typing import Any

from ...errors import IncompatibleDraftError
from ..registry import DraftKind, register_draft_kind
from .drafter import DFlashDrafter
from .extended import SpeculatorsDFlashModel, needs_extension, untrainable_flags
from .losses import dflash_loss
from .formats import is_speculators_dflash, load_speculators_dflash, save_speculators_dflash
from .modeling import (DFLASH_CLASSES, MAX_BLOCK_SIZE, check_dflash_config, dflash_config_for, dflash_draft_for,
                       is_dflash_draft, target_vocab_size)


def _param_groups(draft: Any, stage: int, cfg: Any) -> list[dict]:
    """The whole drafter (the target's embedding and LM head are the target's, frozen)."""
    draft.requires_grad_(True)
    return [{"params": list(draft.parameters()), "lr": cfg.lr if stage == 1 else (cfg.stage2_lr or cfg.lr)}]


def _build(target: Any, language_model: Any, cfg: Any, target_name: str | None) -> Any:
    """A fresh drafter: the ``draft_config``'s layer count, ``cfg.block_size``, ``cfg.target_layers`` (default:
    spread over the target's); checked against the target before any forward (``make_draft``)."""
    draft = dflash_draft_for(target, seed=cfg.seed + 2, block_size=cfg.block_size or 8, target_layer_ids=cfg.target_layers,
                             num_layers=language_model.config.num_hidden_layers).float()
    draft.config.vocab_size = target_vocab_size(draft, target)  # what it proposes from (its card says so)
    return draft


def _training_view(draft: Any, vocab: Any, stage: int) -> DFlashDrafter:
    """The drafter itself; one imported with speculators flags the loss does not reproduce is refused."""
    flags = untrainable_flags(draft.config)
    if flags:
        raise IncompatibleDraftError(f"this DFlash drafter has {', '.join(flags)} (read from speculators' layout), "
                                     "which hf-specmm train's DFlash loss does not reproduce: fine-tune it with "
                                     "speculators, or train a fresh drafter here.")
    return DFlashDrafter(draft, vocab)


def _no_loader(config: Any) -> "type | None":
    """Stock's classes load through their own ``AutoModel`` mapping; one with speculators' biases or reduced
    vocabulary through :class:`~.extended.SpeculatorsDFlashModel`."""
    cls = next((cls for cls in DFLASH_CLASSES if isinstance(config, cls.config_class)), None)
    return SpeculatorsDFlashModel if cls is not None and needs_extension(config) else cls


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
    training_view=_training_view,
    param_groups=_param_groups,
    build=_build,
    loss=dflash_loss,
    card_rows=_card_rows,
    check_config=check_dflash_config,
    target_vocab_size=target_vocab_size,
    block_drafter=True,
    # speculators' dflash layout, read as data (a transformers without the class has no drafter to read it into)
    imports=lambda raw: load_speculators_dflash if DFLASH_CLASSES and is_speculators_dflash(raw) else None,
))

__all__ = ["DFLASH", "DFLASH_CLASSES", "DFlashDrafter", "MAX_BLOCK_SIZE", "SpeculatorsDFlashModel", "dflash_config_for",
           "dflash_draft_for", "is_dflash_draft",
           "is_speculators_dflash", "load_speculators_dflash", "save_speculators_dflash"]
