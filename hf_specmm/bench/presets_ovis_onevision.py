"""LLaVA-OneVision-1.5 and Ovis2.5 benchmark presets (random weights, no download; transformers >= 5.25).

Both targets are a Qwen3-8B language model (36 layers, hidden 4096, MLP 12,288, 32 query / 8 key-value heads
of 128, θ 10^6, 151,936 rows) with the vision tower of transformers' config defaults:

- ``llava-onevision-1.5-8b-shape``: LLaVA-OneVision-1.5-8B-Instruct: RICE-ViT (24 layers, hidden 1024, MLP 4096,
  16 heads, 14-pixel patches merged 2×2, projected to 4096: a 448×448 image is 256 tokens); 1-D positions.
- ``ovis2.5-9b-shape``: Ovis2.5-9B: a SigLIP2-so400m-style ViT (27 layers, hidden 1152, MLP 4304, 16 heads,
  16-pixel patches merged 2×2: a 448×448 image is 196 tokens) and the 65,536-entry visual vocabulary;
  positions by cache column (see ``hf_specmm/targets/ovis2_5.py``).

bf16, each with a Qwen3-0.6B-shaped text draft (28 layers, hidden 1024, MLP 3072, 16 / 8 heads of 128, tied
embeddings, 151,936 rows). ``tiny-llava-onevision-1.5`` / ``tiny-ovis2.5``: the test fixtures' tiny targets
with their random Qwen3 text drafts.

Synthetic prompts: per row the family's image span (``<|vision_start|> <|image_pad|>×n <|vision_end|>``;
Ovis2.5: its image start / end ids around the pads) then random text ids, left-padded, with the patches and
``image_grid_thw`` the processor would give.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from .shapes import left_padded, random_weights

ONEVISION_OVIS_PRESETS = ("llava-onevision-1.5-8b-shape", "ovis2.5-9b-shape", "tiny-llava-onevision-1.5",
                          "tiny-ovis2.5") if hasattr(transformers, "Ovis2_5ForConditionalGeneration") else ()
_TEXT, _PAD, _IMAGE = 151643, 151643, 151655  # Qwen3 tokenizer: text ids below <|endoftext|>
_QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                 tie_word_embeddings=False, model_type="qwen3")
_TINY = {"tiny-llava-onevision-1.5": "llava_onevision1_5", "tiny-ovis2.5": "ovis2_5"}


def _target(name: str, dtype: torch.dtype, device: str) -> Any:
    text = transformers.Qwen3Config(**{k: v for k, v in _QWEN3_8B.items() if k != "model_type"})
    if name == "llava-onevision-1.5-8b-shape":
        config = transformers.LlavaOnevision15Config(text_config=text, vision_config={"out_hidden_size": 4096})
        cls = transformers.LlavaOnevision15ForConditionalGeneration
    else:
        config = transformers.Ovis2_5Config(text_config=text)
        cls = transformers.Ovis2_5ForConditionalGeneration
    return random_weights(cls, config, dtype, device, pad_token_id=_PAD)


def _draft_0_6b(dtype: torch.dtype, device: str) -> Any:
    config = transformers.Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                      num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                      max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return random_weights(transformers.Qwen3ForCausalLM, config, dtype, device)


def build_onevision_ovis_preset(name: str, device: str, dtype: str | None, seed: int, preset_cls: type) -> Any:
    if name not in _TINY:
        dt = getattr(torch, dtype or "bfloat16")
        return preset_cls(_target(name, dt, device), _draft_0_6b(dt, device), 448, _IMAGE, _TEXT,
                          inputs=onevision_ovis_inputs)
    from .. import testing
    from ..testing import ovis_onevision as fixtures

    target = testing.tiny_target(_TINY[name], seed=seed, eos_bias=-30.0).to(device, getattr(torch, dtype or "float32"))
    return preset_cls(target, testing.random_text_draft(target), testing.IMAGE_SIZE, fixtures.IMAGE, fixtures.PAD_ID,
                      inputs=onevision_ovis_inputs)


def onevision_ovis_inputs(preset: Any, batch: int, prompt_tokens: int, seed: int = 0, with_image: bool = True) -> dict:
    """Left-padded rows ``[<start>, <|image_pad|>×n, <end>, text...]`` with image patches."""
    gen = torch.Generator().manual_seed(seed)
    target = preset.target
    config, vision = target.config, target.config.vision_config
    start = getattr(config, "vision_start_token_id", None) or config.image_start_token_id
    end = getattr(config, "vision_end_token_id", None) or config.image_end_token_id
    side = preset.image_size // vision.patch_size  # patches per side
    n_image = side * side // vision.spatial_merge_size ** 2 if with_image else 0
    rows = []
    for i in range(batch):
        text = torch.randint(0, preset.text_vocab, (max(prompt_tokens - 3 * i, 4),), generator=gen).tolist()
        rows.append(([start] + [config.image_token_id] * n_image + [end] if with_image else []) + text)
    ids, mask = left_padded(rows, int(target.generation_config.pad_token_id))
    inputs = {"input_ids": ids, "attention_mask": mask}
    if with_image:
        inputs["pixel_values"] = torch.randn(batch * side * side, 3 * vision.patch_size ** 2, generator=gen)
        inputs["image_grid_thw"] = torch.tensor([[1, side, side]] * batch)
    device, dtype = target.device, next(target.parameters()).dtype
    return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in inputs.items()}
