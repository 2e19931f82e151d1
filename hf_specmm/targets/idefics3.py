"""Idefics3 and SmolVLM (``Idefics3ForConditionalGeneration``, ``SmolVLMForConditionalGeneration``).

Natural text drafts: SmolLM2-135M/360M-Instruct for SmolVLM (a ``LlamaForCausalLM``, 49152 ids). An
image is split into tiles, each written as ``<fake_token_around_image><row_i_col_j><image>*n``, then
``<fake_token_around_image><global-img><image>*n<fake_token_around_image>`` for the downscaled view.

What a text-only draft reads: none of the image block. The ``<image>`` runs are dropped, and so are the
layout tokens ``<global-img>``, the 36 ``<row_i_col_j>`` and ``<fake_token_around_image>``, read by name
from the tokenizer when one is given (``generate(tokenizer=...)``); none of them is ever proposed. In the
SmolVLM tokenizer they are the 38 ids right before ``<image>`` (49152..49189, ``<image>`` = 49190), all
beyond SmolLM2's vocabulary, so a natural draft cannot read them anyway. Without a tokenizer those 38 ids
are only a guess (a fine-tune with added tokens may hold words there): a draft that cannot read them is
unaffected; one that can (an exact copy of the target's LM) reads them as text, and hf_specmm warns once
when a prompt holds them. ``pixel_attention_mask`` (padded tiles) is a per-call input.
"""

from __future__ import annotations

from typing import Any

from .registry import TargetFamily, register_target_family

LAYOUT_TOKENS = ("<global-img>", *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
                 "<fake_token_around_image>")
N_LAYOUT_IDS = len(LAYOUT_TOKENS)  # 38


def _layout_ids(config: Any) -> range:
    """Where the SmolVLM tokenizer puts the layout tokens: the 38 ids right below ``<image>``."""
    image = int(config.image_token_id)
    return range(max(image - N_LAYOUT_IDS, 0), image)


_COMMON = dict(
    per_call_inputs=("pixel_values", "pixel_attention_mask"),
    image_layout_attrs=("scale_factor", "vision_config.image_size", "vision_config.patch_size"),
    layout_tokens=LAYOUT_TOKENS,
    layout_ids=_layout_ids,
)
IDEFICS3 = register_target_family(TargetFamily(
    "idefics3", "Idefics3ForConditionalGeneration", (("image_token_id",),), **_COMMON))
SMOLVLM = register_target_family(TargetFamily(
    "smolvlm", "SmolVLMForConditionalGeneration", (("image_token_id",),), **_COMMON))
