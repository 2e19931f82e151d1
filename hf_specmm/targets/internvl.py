"""InternVL (``InternVLForConditionalGeneration``, the ``-hf`` checkpoints such as InternVL3-8B-hf).

Natural text draft: Qwen2.5-0.5B-Instruct (``Qwen2ForCausalLM``), whose vocabulary (151936 rows) is
LARGER than the target's (151674): draft logits are cut to the target's rows, so ids the target does
not have are never proposed. Each image tile is ``<img><IMG_CONTEXT>*n</img>``; in the InternVL-hf
tokenizers ``<img>`` / ``</img>`` are the two ids right before ``<IMG_CONTEXT>`` (151665..151667, just
after Qwen2.5's text ids, rows a Qwen2.5 draft never trained): a text-only view drops all three, reading
``<img>`` / ``</img>`` by name from the tokenizer when one is given (``generate(tokenizer=...)``); without
one the two ids below ``<IMG_CONTEXT>`` are a guess, read as text by a draft that covers them (with a
warning, once, when a prompt holds them).
"""

from __future__ import annotations

from typing import Any

from .registry import TargetFamily, register_target_family


def _layout_ids(config: Any) -> range:
    image = int(config.image_token_id)
    return range(image - 2, image)  # <img>, </img>


INTERNVL = register_target_family(TargetFamily(
    "internvl", "InternVLForConditionalGeneration", (("image_token_id",),),
    per_call_inputs=("pixel_values",),
    image_layout_attrs=("image_seq_length", "downsample_ratio", "vision_config.image_size",
                        "vision_config.patch_size", "vision_feature_layer"),
    layout_tokens=("<img>", "</img>"),
    layout_ids=_layout_ids,
    one_run_per_image=True,  # pixel_values has a row per tile: at least one per image
))
