"""Ovis2.5 (``Ovis2_5ForConditionalGeneration``: Ovis2.5-2B / 9B; a Qwen3 LM with a native-resolution
vision encoder whose features pass through a visual vocabulary). transformers >= 5.25 (earlier releases have
no such class: nothing is registered).

- Each image is ``<image_start> <|image_pad|>×n <image_end>``, each video ``<video_start> <|video_pad|>×n
  <video_end>`` (the processor writes them; the config names the four boundary ids, whose embeddings the model
  replaces with learned indicator features). A text-only view drops placeholders and boundaries.
- Positions: :data:`~hf_specmm.targets.positions.COLUMNS`. Ovis2.5's ``prepare_inputs_for_generation`` sets
  ``position_ids = None``, so plain ``generate`` numbers cache columns: with left padding a row's positions
  count its pad tokens. Lossless means what plain ``generate`` gives, so the verification blocks, a ``vlm``
  draft of the family and the training forwards number tokens that way too.
- Natural text drafts: Qwen3 LMs (Qwen3-0.6B / 1.7B: 151936 rows, the boundary ids among them, never proposed).
"""

from __future__ import annotations

import transformers

from .positions import COLUMNS
from .registry import TargetFamily, register_target_family

OVIS2_5 = TargetFamily(
    "ovis2_5", "Ovis2_5ForConditionalGeneration", (("image_token_id",), ("video_token_id",)),
    per_call_inputs=("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids"),
    image_layout_attrs=("vision_config.patch_size", "vision_config.spatial_merge_size",
                        "vision_config.temporal_patch_size"),
    span_attrs=(("image_start_token_id",), ("image_end_token_id",), ("video_start_token_id",),
                ("video_end_token_id",)),
    positions=COLUMNS, one_run_per_image=True, image_count_input="image_grid_thw",
    # precomputed vision outputs skip the inputs the prompt checks count and a vlm draft reads
    refused_inputs=("mm_encoder_outputs",),
)
if hasattr(transformers, OVIS2_5.class_name):
    register_target_family(OVIS2_5)
