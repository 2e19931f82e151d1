"""Gemma 4 and Gemma 4 Unified (``Gemma4ForConditionalGeneration``: gemma-4-E2B/E4B/26B-A4B/31B;
``Gemma4UnifiedForConditionalGeneration``, encoder-free: raw merged patches projected into the LM).
transformers >= 5.24 (nothing is registered before: 5.17 has the classes, but its Gemma 4 processors need
torchvision, so neither family is verified there; see ``_compat.GEMMA4_SUPPORTED``).

- An image is ``<|image>`` (boi, inside the text ids) + ``<|image|>`` soft tokens + ``<image|>`` (eoi); how many
  soft tokens depends on the image's aspect ratio (at most the image processor's ``max_soft_tokens``), so
  no fixed count per image is checked. All ids lie inside the 262144 rows of the target and of its natural
  text drafts (Gemma 4 / Gemma 3 text LMs): a text-only view drops the block; none is ever proposed.
- ``mm_token_type_ids`` (1 on image tokens) make the prefill's sliding layers attend bidirectionally
  within each image (``use_bidirectional_attention="vision"``): a per-call input that the target's prefill
  gets from stock generate and a ``vlm`` draft in its prefill; verification blocks are text and, as
  stock's decoding steps, run without it. ``image_position_ids`` (patch coordinates) go with
  ``pixel_values``.
- Per-layer input embeddings are looked up from each forward's ``input_ids`` (a block's own tokens), and
  the KV-shared layers read the K/V their producer layers just wrote to the cache: both follow the block
  whatever its width, mask or cache. Sliding layers: as Gemma 3 (full cache layers, rejected slots
  compacted away).
- Audio (``input_features``) and video (``pixel_values_videos``) are refused before any work: their
  placeholders and encoders are not covered by the prompt checks and fixtures.
- Draft kinds: the checkpoints' own assistants (``gemma4_assistant``, reading the shared K/V), text-only,
  image-adapter (a Gemma 4 text LM's per-layer embeddings are looked up from the token ids, see :meth:`ImageAdapterDraft.per_layer_inputs`) and ``vlm`` drafts, chains and trees, dynamic
  and static caches; EAGLE-1 / EAGLE-3 heads (without the per-layer inputs and KV sharing, which need the
  target's full stack; while a head watches, the decoder computes every prompt position, see
  ``feature_head.drafter.keep_every_position``).
"""

from __future__ import annotations

import transformers

from .. import _compat
from .registry import TargetFamily, register_target_family

_COMMON = dict(
    per_call_inputs=("pixel_values", "image_position_ids", "mm_token_type_ids"),
    image_layout_attrs=("vision_config.patch_size", "vision_config.pooling_kernel_size"),
    span_attrs=(("boi_token_id",), ("eoi_token_id",), ("boa_token_id",), ("eoa_token_index",)),
    one_run_per_image=True,  # <|image> <|image|>×n <image|> per image
    refused_inputs=("input_features", "input_features_mask", "pixel_values_videos", "video_position_ids"),
)
_PLACEHOLDERS = (("image_token_id",), ("video_token_id",), ("audio_token_id",))

GEMMA4 = TargetFamily("gemma4", "Gemma4ForConditionalGeneration", _PLACEHOLDERS, **_COMMON)
GEMMA4_UNIFIED = TargetFamily("gemma4_unified", "Gemma4UnifiedForConditionalGeneration", _PLACEHOLDERS, **_COMMON)
for _family in (GEMMA4, GEMMA4_UNIFIED):
    if _compat.GEMMA4_SUPPORTED and hasattr(transformers, _family.class_name):
        register_target_family(_family)
