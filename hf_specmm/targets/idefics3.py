"""Idefics3 and SmolVLM (``Idefics3ForConditionalGeneration``, ``SmolVLMForConditionalGeneration``).

Natural text drafts: SmolLM2-135M/360M-Instruct for SmolVLM (a ``LlamaForCausalLM``, 49152 ids). An
image is split into tiles, each written as ``<fake_token_around_image><row_i_col_j><image>*n``, then
``<fake_token_around_image><global-img><image>*n<fake_token_around_image>`` for the downscaled view.

What a text-only draft reads: none of the image block. The ``<image>`` runs are dropped, and so are the
layout tokens ``<global-img>``, the 36 ``<row_i_col_j>`` and ``<fake_token_around_image>``: in the
SmolVLM tokenizer they are the 38 ids right before ``<image>`` (49152..49189, ``<image>`` = 49190),
all beyond SmolLM2's vocabulary, so a natural draft could not read them anyway; dropping them for every
draft gives an exact copy of the target's LM the same view as a SmolLM2 draft, and none of them is ever
proposed. ``pixel_attention_mask`` (padded tiles) is a per-call input.
"""

from __future__ import annotations

from typing import Any

from .registry import TargetFamily, register_target_family

N_LAYOUT_IDS = 38  # <global-img>, <row_1_col_1> .. <row_6_col_6>, <fake_token_around_image>


def _layout_ids(config: Any) -> range:
    image = int(config.image_token_id)
    return range(max(image - N_LAYOUT_IDS, 0), image)


_COMMON = dict(
    per_call_inputs=("pixel_values", "pixel_attention_mask"),
    image_layout_attrs=("scale_factor", "vision_config.image_size", "vision_config.patch_size"),
    layout_ids=_layout_ids,
)
IDEFICS3 = register_target_family(TargetFamily(
    "idefics3", "Idefics3ForConditionalGeneration", (("image_token_id",),), **_COMMON))
SMOLVLM = register_target_family(TargetFamily(
    "smolvlm", "SmolVLMForConditionalGeneration", (("image_token_id",),), **_COMMON))
