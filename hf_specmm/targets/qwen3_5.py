"""Qwen3.5 (``Qwen3_5ForConditionalGeneration``; in transformers 5.17 to 5.25): a hybrid decoder, Gated DeltaNet
linear-attention layers (three in four) between full-attention layers, and Qwen3-VL's vision side.

- Token layout and positions as Qwen3-VL: ``<|vision_start|> <|image_pad|>×n <|vision_end|>`` per image, 3-D
  M-RoPE (:class:`~hf_specmm.targets.positions.MRope`; text resumes after an image at its largest position + 1).
- Natural text drafts: Qwen3.5 text LMs (``Qwen3_5ForCausalLM``, themselves hybrid) or Qwen3 LMs
  (``Qwen3ForCausalLM``, 151,936 rows beside Qwen3.5's 248,320: ids past the draft's rows are never proposed).
- The linear-attention layers keep states, not slots: both the target's and a hybrid draft's caches roll them
  back by snapshot and replay (:mod:`hf_specmm.caches.linear`, ``docs/stateful-layers.md``). Draft trees need
  per-node states and are refused before any work.

Qwen3.5-MoE (``Qwen3_5MoeForConditionalGeneration``, the same transformers versions) is the same architecture with
sparse MoE MLPs (routed experts plus a gated shared expert): the same family rules under its own class; natural
text drafts are Qwen3.5 LMs (dense) or a Qwen3.5-MoE's language model (``qwen3_5_moe_text``,
``Qwen3_5MoeForCausalLM``).
"""

from __future__ import annotations

import dataclasses

import transformers

from .positions import MROPE
from .registry import TargetFamily, register_target_family

QWEN3_5 = TargetFamily(
    "qwen3_5", "Qwen3_5ForConditionalGeneration", (("image_token_id",), ("video_token_id",)),
    per_call_inputs=("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids"),
    image_layout_attrs=("vision_config.patch_size", "vision_config.spatial_merge_size",
                        "vision_config.temporal_patch_size"),
    span_attrs=(("vision_start_token_id",), ("vision_end_token_id",)),
    positions=MROPE, text_model_type="qwen3_5_text", one_run_per_image=True, image_count_input="image_grid_thw",
)
if hasattr(transformers, QWEN3_5.class_name):  # a transformers without Qwen3.5 lists no such target
    register_target_family(QWEN3_5)

# a fresh text draft (``hf-specmm train``) stays a dense Qwen3.5 LM (``qwen3_5_text``), as Qwen3-VL-MoE's a dense Qwen3
QWEN3_5_MOE = dataclasses.replace(QWEN3_5, name="qwen3_5_moe", class_name="Qwen3_5MoeForConditionalGeneration")
if hasattr(transformers, QWEN3_5_MOE.class_name):
    register_target_family(QWEN3_5_MOE)
