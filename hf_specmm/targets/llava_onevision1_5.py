"""LLaVA-OneVision-1.5 (``LlavaOnevision15ForConditionalGeneration``: LLaVA-OneVision-1.5-4B / 8B-Instruct; a Qwen3 LM
with a RICE-ViT vision tower). transformers >= 5.25 (earlier releases have no such class: nothing is registered).

- Each image is ``<|vision_start|> <|image_pad|>×n <|vision_end|>`` (``<|video_pad|>`` for a video), as
  Qwen2.5-VL writes it (the chat template writes the markers, the processor expands the pad: n = the grid's
  patches / merge_size²); ``pixel_values`` are patches, so ``image_grid_thw`` counts the images.
- Positions: 1-D RoPE (:data:`~hf_specmm.targets.positions.ROPE_1D`): the model drops Qwen2.5-VL's M-RoPE
  and plain ``generate`` numbers a left-padded prompt ``cumsum(mask) - 1``; images add no position axes.
- Natural text drafts: Qwen3 LMs (Qwen3-0.6B: the same 151936 ids); a smaller LLaVA-OneVision-1.5 is a
  ``vlm`` draft. ``second_per_grid_ts`` (video timing that its forward accepts and ignores) changes nothing.
"""

from __future__ import annotations

import transformers

from .registry import TargetFamily, register_target_family

LLAVA_ONEVISION1_5 = TargetFamily(
    "llava_onevision1_5", "LlavaOnevision15ForConditionalGeneration", (("image_token_id",), ("video_token_id",)),
    per_call_inputs=("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids"),
    image_layout_attrs=("vision_config.patch_size", "vision_config.spatial_merge_size"),
    span_attrs=(("vision_start_token_id",), ("vision_end_token_id",)),
    one_run_per_image=True, image_count_input="image_grid_thw",
    # precomputed vision outputs skip the inputs the prompt checks count and a vlm draft reads
    refused_inputs=("mm_encoder_outputs",),
)
if hasattr(transformers, LLAVA_ONEVISION1_5.class_name):
    register_target_family(LLAVA_ONEVISION1_5)
