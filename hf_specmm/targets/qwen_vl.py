"""The Qwen-VL families: Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE. 3-D multimodal RoPE (M-RoPE).

Each image or video becomes ``<|vision_start|> <|image_pad|>×n <|vision_end|>`` (``<|video_pad|>`` for
videos; Qwen3-VL puts a timestamp before each frame group). A text-only draft (Qwen2.5-0.5B-Instruct,
Qwen3-0.6B) reads the conversation with those spans removed; the pad and marker ids lie inside its
vocabulary and are never proposed. Positions follow :class:`~hf_specmm.targets.positions.MRope`.

Qwen3-VL-MoE (Qwen3-VL-30B-A3B, 235B-A22B) is Qwen3-VL (same processor, M-RoPE, deepstack) with sparse
MoE MLPs. Its router picks each token's top-k experts from that token's hidden state alone (softmax, top-k,
renormalised; no capacity limit, nothing dropped), so a verification block of gamma + 1 tokens routes every
token as gamma + 1 single steps would. Its natural text draft is dense: Qwen3-0.6B (151936 rows, as the target).
"""

from __future__ import annotations

from .positions import MROPE
from .registry import TargetFamily, register_target_family

_PLACEHOLDERS = (("image_token_id",), ("video_token_id",))
_SPANS = (("vision_start_token_id",), ("vision_end_token_id",))
_INPUTS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts",
           "mm_token_type_ids")
# what fixes how many placeholders an image / video expands to, and where the following text resumes
_LAYOUT = ("vision_config.patch_size", "vision_config.spatial_merge_size", "vision_config.temporal_patch_size")


def _family(name: str, class_name: str, text_model_type: str, layout: tuple[str, ...] = ()) -> TargetFamily:
    return register_target_family(TargetFamily(
        name, class_name, _PLACEHOLDERS, per_call_inputs=_INPUTS, image_layout_attrs=_LAYOUT + layout,
        span_attrs=_SPANS, positions=MROPE, text_model_type=text_model_type,
        one_run_per_image=True, image_count_input="image_grid_thw",
    ))


QWEN2_VL = _family("qwen2_vl", "Qwen2VLForConditionalGeneration", "qwen2")
QWEN2_5_VL = _family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2",
                     ("vision_config.tokens_per_second",))  # video frames' temporal spacing
QWEN3_VL = _family("qwen3_vl", "Qwen3VLForConditionalGeneration", "qwen3")
QWEN3_VL_MOE = _family("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", "qwen3")  # dense Qwen3 text drafts
