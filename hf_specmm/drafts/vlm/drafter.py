"""Same-family VLM drafting: a small VLM (or the target itself) that sees the images.

The draft receives the target's prompt as it is, image placeholders included, and the call's image
inputs (``pixel_values``, ``image_sizes``, ...): its vision tower runs once per ``generate`` call, in
its prefill; every later step reads only its own KV cache, rolled back like the other kinds'.
"""

from __future__ import annotations

from typing import Any

import torch

from ...drafter import DraftPrompt, Prompt
from ...errors import IncompatibleDraftError
from ...targets import family_of, target_family, target_spec
from ...vocab import VocabMap
from ..chain import LMDrafter

_OPT_OUT = ("To draft with its language model only (it will not see the images), pass "
            "assistant_model=hf_specmm.TextOnly(draft).")


class VLMDrafter(LMDrafter):
    def __init__(self, draft: Any, vocab: VocabMap):
        self.family = family_of(draft)
        assert self.family is not None, "VLMDrafter needs a draft of a registered target family"
        super().__init__(draft, vocab, positions=self.family.positions)

    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        """Same placeholder ids, same number of placeholders per image, the target's image inputs suffice."""
        t_family, d_family = target_family(target), target_family(draft)
        name = f"The assistant_model ({type(draft).__name__})"
        t_ids, d_ids = target_spec(target).placeholder_ids, target_spec(draft).placeholder_ids
        if t_ids != d_ids:
            raise IncompatibleDraftError(
                f"{name} marks images with placeholder ids {sorted(d_ids)}, the target with {sorted(t_ids)}: "
                f"it cannot read the target's prompt. {_OPT_OUT}")
        missing = [k for k in d_family.per_call_inputs if k not in t_family.per_call_inputs]
        if missing and d_family != t_family:
            raise IncompatibleDraftError(
                f"{name} is a {d_family.name} model and needs inputs a {t_family.name} target's call does not "
                f"have ({', '.join(missing)}). {_OPT_OUT}")
        t_layout, d_layout = t_family.image_layout(target.config), d_family.image_layout(draft.config)
        if d_family != t_family or t_layout != d_layout:
            diff = [f"{k}: target {t_layout.get(k)!r}, draft {d_layout.get(k)!r}"
                    for k in sorted(set(t_layout) | set(d_layout)) if t_layout.get(k) != d_layout.get(k)]
            raise IncompatibleDraftError(
                f"{name} would expand an image into a different number of placeholder tokens than the target "
                f"({d_family.name} vs {t_family.name}; {'; '.join(diff) or 'different families'}). "
                f"{_OPT_OUT}")

    @classmethod
    def prompt_lengths(cls, draft: Any, vocab: VocabMap, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The whole prompt, placeholders included: the VLM reads it as the target does."""
        if attention_mask is None:
            return torch.full((input_ids.shape[0],), input_ids.shape[1], device=input_ids.device)
        return attention_mask.long().sum(-1)

    def draft_inputs(self, prompt: Prompt) -> DraftPrompt:
        ids = prompt.input_ids
        mask = prompt.attention_mask
        valid = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        # the family's position rule bound to this prompt (M-RoPE: grid positions of its images)
        positions = self.family.positions.bind(self.model, ids, mask, prompt.model_inputs)
        dtype = next(self.model.parameters()).dtype
        extra = {k: (v.to(device=self.device, dtype=dtype) if torch.is_floating_point(v) else v.to(self.device))
                 if isinstance(v, torch.Tensor) else v
                 for k, v in self.family.model_inputs(prompt.model_inputs).items()}
        return DraftPrompt(ids, valid, positions, extra)
