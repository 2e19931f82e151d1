"""Qwen3.5 benchmark presets (random weights, no download).

- ``qwen3.5-9b-shape``: Qwen3.5-9B's configuration (transformers' ``Qwen3_5TextConfig`` defaults, documented as
  the Qwen3.5-9B style: 32 layers, linear attention ×3 then full attention, hidden 4096, MLP 12,288; gated
  attention with 16 query / 4 key-value heads of 256, a quarter of each rotated, interleaved M-RoPE
  [11, 11, 10], θ 10^7; Gated DeltaNet with 16 key / 32 value heads of 128, conv kernel 4; 248,320 rows; a
  27-layer ViT with 16-pixel patches merged 2×2: a 448×448 image is 196 tokens), bf16, with a draft shaped as
  Qwen3.5-0.8B's text LM (``Qwen3_5ForCausalLM``, itself hybrid: 24 layers, hidden 1024, MLP 3584, 8 / 2
  heads of 256; its Gated DeltaNet heads, 16 of 128, are not in the public configs read here), 248,320 rows.
- ``tiny-qwen3.5``: the test fixtures' tiny Qwen3.5 with a random hybrid text draft.

Synthetic prompts as the Qwen2.5-VL presets' (``presets_qwen.qwen_inputs``).
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from .presets_qwen import qwen_inputs
from .shapes import random_weights

QWEN3_5_PRESETS = ("qwen3.5-9b-shape", "tiny-qwen3.5")
# upstream ids (Qwen3.5 tokenizer): text ids below 248044, then <|endoftext|>, ..., vision markers and pads
_UPSTREAM = dict(text=248044, pad=248044, start=248053, end=248054, image=248056, video=248057)
_ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
         "mrope_section": [11, 11, 10], "mrope_interleaved": True}


def _target_9b(dtype: torch.dtype, device: str) -> Any:
    text = dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_conv_kernel_dim=4, max_position_embeddings=262144, rms_norm_eps=1e-6, rope_parameters=_ROPE,
                tie_word_embeddings=False)
    vision = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=4096, num_position_embeddings=2304)
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=_UPSTREAM["image"],
                                        video_token_id=_UPSTREAM["video"], vision_start_token_id=_UPSTREAM["start"],
                                        vision_end_token_id=_UPSTREAM["end"], tie_word_embeddings=False)
    return random_weights(transformers.Qwen3_5ForConditionalGeneration, config, dtype, device,
                          pad_token_id=_UPSTREAM["pad"])


def _draft_0_8b(dtype: torch.dtype, device: str) -> Any:
    config = transformers.Qwen3_5TextConfig(
        vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
        num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, max_position_embeddings=262144,
        rms_norm_eps=1e-6, rope_parameters=_ROPE, tie_word_embeddings=True)
    return random_weights(transformers.Qwen3_5ForCausalLM, config, dtype, device)


def build_qwen3_5_preset(name: str, device: str, dtype: str | None, seed: int, preset_cls: type) -> Any:
    if name == "qwen3.5-9b-shape":
        dt = getattr(torch, dtype or "bfloat16")
        return preset_cls(_target_9b(dt, device), _draft_0_8b(dt, device), 448, _UPSTREAM["image"],
                          _UPSTREAM["text"], inputs=qwen_inputs)
    from .. import testing
    from ..testing import qwen_vl as qwen

    target = testing.tiny_target("qwen3_5", seed=seed, eos_bias=-30.0).to(device, getattr(torch, dtype or "float32"))
    return preset_cls(target, testing.random_text_draft(target), testing.IMAGE_SIZE, qwen.IMAGE_ID, qwen.PAD_ID,
                      inputs=qwen_inputs)
