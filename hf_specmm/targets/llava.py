"""The LLaVA families: LLaVA-1.5, LLaVA-NeXT (anyres) and LLaVA-OneVision. 1-D rotary positions."""

from __future__ import annotations

from .registry import TargetFamily, register_target_family

_IMAGE = ("image_token_id", "image_token_index")
_VISION = ("vision_config.image_size", "vision_config.patch_size", "vision_feature_select_strategy")

LLAVA = register_target_family(TargetFamily(
    "llava", "LlavaForConditionalGeneration", (_IMAGE,),
    per_call_inputs=("pixel_values", "image_sizes"),
    image_layout_attrs=_VISION + ("image_seq_length",),
    tokens_per_image_attr="image_seq_length",
    one_run_per_image=True,
))
LLAVA_NEXT = register_target_family(TargetFamily(
    "llava_next", "LlavaNextForConditionalGeneration", (_IMAGE,),
    per_call_inputs=("pixel_values", "image_sizes"),
    image_layout_attrs=_VISION + ("image_grid_pinpoints",),
    one_run_per_image=True,
))
LLAVA_ONEVISION = register_target_family(TargetFamily(
    "llava_onevision", "LlavaOnevisionForConditionalGeneration", (_IMAGE, ("video_token_id", "video_token_index")),
    per_call_inputs=("pixel_values", "image_sizes", "pixel_values_videos", "image_sizes_videos", "batch_num_images"),
    image_layout_attrs=_VISION + ("image_grid_pinpoints", "vision_aspect_ratio"),
    one_run_per_image=True,
))
