"""Qwen2.5-VL benchmark presets (random weights, no download).

- ``qwen2.5-vl-7b-shape``: the Qwen2.5-VL-7B-Instruct configuration (28-layer Qwen2 LM, hidden 3584,
  152,064-row vocab; 32-layer ViT with 14-pixel patches merged 2×2: a 448×448 image is 256 tokens),
  bf16, with a Qwen2.5-0.5B-Instruct-shaped draft (24 layers, hidden 896, 151,936 rows).
- ``tiny-qwen2.5-vl``: the test fixtures' tiny Qwen2.5-VL with its natural-shape random text draft.

Synthetic prompts: ``<|vision_start|> <|image_pad|>×n <|vision_end|>`` then random text ids, left-padded,
with the ``image_grid_thw`` / ``mm_token_type_ids`` the processor would give.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Config, Qwen2ForCausalLM

from .shapes import left_padded, random_weights

QWEN_PRESETS = ("qwen2.5-vl-7b-shape", "tiny-qwen2.5-vl")
# upstream ids (Qwen2.5 tokenizer): text ids below 151643, then <|endoftext|>, ..., vision markers and pads
_UPSTREAM = dict(text=151643, pad=151643, start=151652, end=151653, image=151655, video=151656)


def _target_7b(dtype: torch.dtype, device: str) -> Any:
    text = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]})
    vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112, tokens_per_second=2,
                  fullatt_block_indexes=[7, 15, 23, 31])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=_UPSTREAM["image"],
                              video_token_id=_UPSTREAM["video"], vision_start_token_id=_UPSTREAM["start"],
                              vision_end_token_id=_UPSTREAM["end"], pad_token_id=_UPSTREAM["pad"])
    return random_weights(Qwen2_5_VLForConditionalGeneration, config, dtype, device, pad_token_id=_UPSTREAM["pad"])


def _draft_0_5b(dtype: torch.dtype, device: str) -> Any:
    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return random_weights(Qwen2ForCausalLM, config, dtype, device)


def build_qwen_preset(name: str, device: str, dtype: str | None, seed: int, preset_cls: type) -> Any:
    if name == "qwen2.5-vl-7b-shape":
        dt = getattr(torch, dtype or "bfloat16")
        return preset_cls(_target_7b(dt, device), _draft_0_5b(dt, device), 448, _UPSTREAM["image"],
                          _UPSTREAM["text"], inputs=qwen_inputs)
    from ..testing import qwen_vl as qwen
    from .. import testing

    target = testing.tiny_target("qwen2_5_vl", seed=seed, eos_bias=-30.0).to(device, getattr(torch, dtype or "float32"))
    return preset_cls(target, testing.random_text_draft(target), testing.IMAGE_SIZE, qwen.IMAGE_ID,
                      qwen.PAD_ID, inputs=qwen_inputs)


def qwen_inputs(preset: Any, batch: int, prompt_tokens: int, seed: int = 0, with_image: bool = True) -> dict:
    """Left-padded rows ``[<|vision_start|>, <|image_pad|>×n, <|vision_end|>, text...]`` with image patches."""
    gen = torch.Generator().manual_seed(seed)
    target = preset.target
    config, vision = target.config, target.config.vision_config
    side = preset.image_size // vision.patch_size  # patches per side
    n_image = side * side // vision.spatial_merge_size ** 2 if with_image else 0
    rows = []
    for i in range(batch):
        text = torch.randint(0, preset.text_vocab, (max(prompt_tokens - 3 * i, 4),), generator=gen).tolist()
        image = [config.vision_start_token_id] + [config.image_token_id] * n_image + [config.vision_end_token_id]
        rows.append((image if with_image else []) + text)
    ids, mask = left_padded(rows, int(target.generation_config.pad_token_id))
    inputs = {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == config.image_token_id).long()}
    if with_image:
        patch = 3 * vision.temporal_patch_size * vision.patch_size ** 2
        inputs["pixel_values"] = torch.randn(batch * side * side, patch, generator=gen)
        inputs["image_grid_thw"] = torch.tensor([[1, side, side]] * batch)
    device, dtype = target.device, next(target.parameters()).dtype
    return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in inputs.items()}
