"""Muse Glimmer (``MuseGlimmerForConditionalGeneration``, Muse-Glimmer-30B; in transformers 5.17 to 5.25).

- Positions: 1-D RoPE (:data:`~hf_specmm.targets.positions.ROPE_1D`). Images add no position axes: stock
  ``generate`` numbers a left-padded prompt ``cumsum(mask) - 1`` and the text decoder reads those ids on its
  RoPE layers; every fourth layer (counted back from the last) is NoPE with full attention, the others
  slide over a 2048-token window (kept exact by the caches' compaction, as for Gemma 3).
- Each image is ``<|image_start|> <|patch|>×n <|image_end|>`` (n = the grid's patches / merge_size²), each video
  ``<|vid_start|>`` then per frame group a timestamp, ``<|video|>×n`` and ``<|vid_frame_separator|>`` /
  ``<|vid_end|>``. ``pixel_values`` are patches, so ``image_grid_thw`` counts the images.
- The config names only ``<|patch|>`` and ``<|video|>`` (``image_token_id`` / ``video_token_id``); the span
  markers are read by name from the tokenizer when one is given (``generate(tokenizer=...)``, pipelines) and
  dropped from a text-only draft's view with the placeholders. Without one they stay in that view: they lie
  inside the text vocabulary (the Llama-4-style 202048-id tokenizer holds every special token), so a draft
  reads them as the special tokens they are.
- Logits are ``softcap · tanh(lm_head(h) · output_multiplier / softcap)``: the loop reads the target's logits
  as they are, so verification sees exactly what plain ``generate`` sees.
- No small text LM with this vocabulary is published; any causal LM over the Muse tokenizer (202048 ids) is a
  text-only draft (``hf-specmm train`` makes a fresh one a Llama), a ``MuseGlimmerForConditionalGeneration`` a ``vlm`` draft. Its own DFlash assistant
  (``MuseGlimmerAssistantModel``) is the ``dflash`` draft kind (``hf_specmm/drafts/dflash``).
"""

from __future__ import annotations

import transformers

from .registry import TargetFamily, register_target_family

MARKERS = ("<|image_start|>", "<|image_end|>", "<|vid_start|>", "<|vid_end|>", "<|vid_frame_separator|>")

MUSE_GLIMMER = None
if hasattr(transformers, "MuseGlimmerForConditionalGeneration"):  # absent from transformers releases before it
    MUSE_GLIMMER = register_target_family(TargetFamily(
        "muse_glimmer", "MuseGlimmerForConditionalGeneration", (("image_token_id",), ("video_token_id",)),
        per_call_inputs=("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"),
        image_layout_attrs=("vision_config.patch_size", "vision_config.merge_size", "vision_config.patch_temporal"),
        layout_tokens=MARKERS,
        one_run_per_image=True, image_count_input="image_grid_thw",
        text_model_type="llama",  # no causal LM of its own text config: a fresh text draft is a Llama
    ))
