"""Step3.7 (``Step3p7ForConditionalGeneration``, Step-3.7-Flash; transformers >= 5.25: nothing is registered before,
see ``_compat.STEP3P7_SUPPORTED``).

- Positions: 1-D RoPE (:data:`~hf_specmm.targets.positions.ROPE_1D`), per layer type; sliding-window and full
  attention layers (kept exact by the caches' compaction, as for Gemma 3), per-head attention gates, MoE MLPs.
- An image is one global view (``pixel_values``, one per image: they count the images) and zero or more local
  crops (``pixel_values_local``, every image's crops flattened, ``num_local_patches`` per image). The processor
  writes ``<patch_start> <im_patch>×n <patch_end>`` per crop (``<patch_newline>`` after each crop row but the
  last) then ``<im_start> <im_patch>×m <im_end>``: several placeholder runs per image. The config names only
  ``<im_patch>`` (``image_token_id``); the markers are read by name from the tokenizer when one is given and
  dropped from a text-only draft's view with the placeholders.
- transformers has no causal LM of Step3.7's text config: a fresh text-only draft is a Llama over the same
  vocabulary, a ``Step3p7ForConditionalGeneration`` a ``vlm`` draft.
"""

from __future__ import annotations

import transformers

from .. import _compat
from .registry import TargetFamily, register_target_family

MARKERS = ("<im_start>", "<im_end>", "<patch_start>", "<patch_end>", "<patch_newline>")

STEP3P7 = None
if _compat.STEP3P7_SUPPORTED and hasattr(transformers, "Step3p7ForConditionalGeneration"):
    STEP3P7 = register_target_family(TargetFamily(
        "step3p7", "Step3p7ForConditionalGeneration", (("image_token_id",),),
        per_call_inputs=("pixel_values", "pixel_values_local", "num_local_patches"),
        image_layout_attrs=("vision_config.image_size", "vision_config.patch_size"),
        layout_tokens=MARKERS,
        text_model_type="llama",  # no causal LM of its own text config: a fresh text draft is a Llama
    ))
