"""Inkling (``InklingForConditionalGeneration``; transformers >= 5.25: nothing is registered before, see
``_compat.INKLING_SUPPORTED``).

- Every decoder layer is a hybrid: attention (full, ``"hybrid"``, or sliding-window, ``"hybrid_sliding"``) with
  short causal convolutions on its keys, its values, its output and the MLP's output. Their conv states (the
  last K inputs of each) are rolled back by a window over the verified block's inputs
  (:mod:`hf_specmm.caches.short_conv`); keys and values are slots, as for any attention layer.
- Positions: none are passed to attention. A relative position bias over ``query column - key column`` (and, when
  ``log_scaling_n_floor`` is set, a logit scale growing with the query's column) reads the cache's columns, so
  the caches move every row's holes to its left end after each rollback: a row is then a left-padded sequence,
  as in plain ``generate``, and distances between its tokens are the same. The column of a row with holes is
  further right than plain ``generate``'s, which the log scaling would see: with it set, a batch of more than
  one row is refused.
- An image is ``<|content_image|>`` then one ``image_token_id`` per 2-frame patch (``pixel_values``
  [patches, 2, P, P, 3], one row per patch: they count the images' pieces). Audio inputs are refused.
- transformers' ``InklingForCausalLM`` reads the text stream: it is the fresh text-only draft.
"""

from __future__ import annotations

import transformers

from .. import _compat
from .registry import TargetFamily, register_target_family

INKLING = None
if _compat.INKLING_SUPPORTED and hasattr(transformers, "InklingForConditionalGeneration"):
    INKLING = register_target_family(TargetFamily(
        "inkling", "InklingForConditionalGeneration", (("image_token_id",),),
        per_call_inputs=("pixel_values",),
        image_layout_attrs=("vision_config.patch_size", "vision_config.temporal_patch_size"),
        span_attrs=(("image_bos_token_id",),),
        # pixel_values has a row per patch and no input counts the images: runs cannot be checked against them
        one_run_per_image=False,
        refused_inputs=("audio_input_ids", "audio_input_ids_mask", "mm_encoder_outputs"),
        refused_draft_kinds=(("eagle3", "an EAGLE-3 head's Llama layers take rotary position embeddings, and "
                                        "Inkling's text model has none (its attention reads cache columns)"),),
    ))
