"""Gemma 3 (``Gemma3ForConditionalGeneration``: gemma-3-4b/12b/27b-it); natural text drafts: gemma-3-270m-it,
gemma-3-1b-it (``Gemma3ForCausalLM``).

- ``<image_soft_token>`` (262144) lies beyond the text drafts' 262144-id vocabulary; ``<start_of_image>`` /
  ``<end_of_image>`` (255999 / 256000) are inside it: a text-only view drops all three (the image block).
- ``token_type_ids`` (1 on image tokens) make the prefill attend bidirectionally within each image; it is
  a per-call input: the target's prefill gets it from stock generate, a ``vlm`` draft gets it in its
  prefill. Verification blocks are text only and, as in stock decoding steps, run without it.
- ``<end_of_turn>`` is a second EOS (``generation_config.eos_token_id`` is a list): honoured by stock's
  stopping criteria, which the loop uses as they are.
- Sliding-window layers: the loop keeps full layers for its caches and compacts rejected slots away,
  so the window covers the same tokens as in plain generate (see :mod:`hf_specmm.caches.base`).
"""

from __future__ import annotations

from .registry import TargetFamily, register_target_family

GEMMA3 = register_target_family(TargetFamily(
    "gemma3", "Gemma3ForConditionalGeneration", (("image_token_id", "image_token_index"),),
    per_call_inputs=("pixel_values", "token_type_ids"),
    image_layout_attrs=("mm_tokens_per_image", "vision_config.image_size", "vision_config.patch_size"),
    span_attrs=(("boi_token_id", "boi_token_index"), ("eoi_token_id", "eoi_token_index")),
    one_run_per_image=True,  # <start_of_image> <image_soft_token>×n <end_of_image> per image (and per crop)
))
