"""A DFlash drafter with what speculators' ``dflash`` layout adds to transformers' ``MuseGlimmerAssistantModel``:
biased attention projections (``attention_bias``) and a reduced draft vocabulary (``draft_vocab_size`` ids scored
by its own ``lm_head``, mapped to target ids by ``d2t``: target id = draft id + ``d2t[id]``, ``t2d`` marking them,
as speculators' and :mod:`hf_specmm.drafts.feature_head.eagle3`'s maps).

The layout's two mask flags need no module: they are config fields the drafter's masks read
(:func:`~.context.block_masks`): ``sliding_window_non_causal`` (False: sliding layers attend causally inside
the block) and ``window_from_anchor`` (True: a sliding layer's block sees the context positions
``[anchor - sliding_window, anchor)``, as speculators' mask; transformers' windows each query by its own position).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .modeling import DFLASH_CLASSES

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def untrainable_flags(config: Any) -> list[str]:
    """The speculators flags of a DFlash config that this package's DFlash loss does not reproduce (its masks are
    transformers', its logits the target's LM head)."""
    flags = []
    if getattr(config, "draft_vocab_size", None) is not None:
        flags.append(f"draft_vocab_size={config.draft_vocab_size}")
    if getattr(config, "window_from_anchor", False):
        flags.append("window_from_anchor=True (speculators' sliding window)")
    if not getattr(config, "sliding_window_non_causal", True):
        flags.append("sliding_window_non_causal=False")
    return flags


def needs_extension(config: Any) -> bool:
    """Whether a DFlash config has biased projections or a reduced draft vocabulary (this module's class)."""
    return bool(getattr(config, "attention_bias", False)) or getattr(config, "draft_vocab_size", None) is not None


if DFLASH_CLASSES:
    class SpeculatorsDFlashModel(DFLASH_CLASSES[0]):  # type: ignore[misc,valid-type]
        """``MuseGlimmerAssistantModel`` with biased q / k / v / o projections where ``config.attention_bias`` and,
        where ``config.draft_vocab_size`` is set, ``lm_head`` [draft_vocab_size, hidden] with ``d2t`` / ``t2d``
        (``config.vocab_size``: the target's vocabulary)."""

        def __init__(self, config: Any):
            super().__init__(config)
            if getattr(config, "attention_bias", False):
                for layer in self.layers:
                    attention = layer.self_attn
                    for name in _PROJECTIONS:
                        old = getattr(attention, name)
                        setattr(attention, name, nn.Linear(old.in_features, old.out_features, bias=True))
            self.lm_head: nn.Linear | None = None
            if getattr(config, "draft_vocab_size", None) is not None:
                vocab = int(config.draft_vocab_size)
                self.lm_head = nn.Linear(config.hidden_size, vocab, bias=False)
                self.register_buffer("d2t", torch.zeros(vocab, dtype=torch.long))
                self.register_buffer("t2d", torch.zeros(int(config.vocab_size), dtype=torch.bool))
                self.t2d[:vocab] = True  # the first ids until a vocabulary is set

        @property
        def draft_ids(self) -> torch.Tensor:
            """[Vd] the target id of each draft id."""
            return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

        def target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            """[.., V] target-vocabulary logits of the drafter's normed output: the draft vocabulary's at their target
            ids, -inf elsewhere."""
            assert self.lm_head is not None
            small = self.lm_head(hidden.to(self.lm_head.weight.dtype))
            full = small.new_full((*small.shape[:-1], self.t2d.numel()), float("-inf"))
            return full.index_copy(-1, self.draft_ids.to(small.device), small)
else:  # a transformers without the class: nothing to extend
    SpeculatorsDFlashModel = None  # type: ignore[assignment,misc]
