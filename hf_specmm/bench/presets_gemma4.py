"""Gemma 4 benchmark presets (random weights, no download; transformers >= 5.24).

- ``gemma4-e2b-shape``: transformers 5.24's ``Gemma4Config`` defaults, which its docstring gives as
  ``google/gemma-4-e2b-it``-like: a 30-layer Gemma 4 LM (hidden 2304, 8 heads / 4 KV heads of 256, full
  layers every 6th with 512-wide heads, sliding window 512, per-layer input embeddings of 256 per layer
  over 262,144 ids), and a 16-layer vision tower (hidden 768, 16-px patches pooled 3×3: a 768×768 image is
  256 soft tokens, padded to 2,520 patches as the image processor's 280-token budget does), bf16; untied
  LM head (the margin rule needs one). Draft: a Gemma 3 270M-shaped text LM (18 layers, hidden 640, 4 heads /
  1 KV head of 256, window 512, the same 262,144 ids).
- ``tiny-gemma4``: the test fixtures' tiny Gemma 4 with its natural-vocabulary random text draft.

Draft kind ``gemma4_assistant`` (:func:`assistant_for`): a random stock Gemma 4 assistant fitted to the preset's
target (its attention shapes, window and vocabulary). ``tiny-gemma4`` only: ``Gemma4AssistantConfig``'s one shape
default, ``backbone_hidden_size=1536``, does not match ``gemma4-e2b-shape``'s hidden size 2304 (5.24's
``Gemma4TextConfig`` defaults): the defaults describe no E2B target/assistant pair, so none is made up here.

Synthetic prompts: ``<bos> <|image> <|image|>×n <image|>`` then random text ids, left-padded, with the
``mm_token_type_ids``, ``pixel_values`` and ``image_position_ids`` the processor would give.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _compat
from .shapes import left_padded, random_weights

GEMMA4_PRESETS = ("gemma4-e2b-shape", "tiny-gemma4") if _compat.GEMMA4_SUPPORTED else ()
_MAX_SOFT_TOKENS = 280  # Gemma4ImageProcessor's default budget
#: presets whose target an assistant can read (see the module docstring for gemma4-e2b-shape)
ASSISTANT_PRESETS = ("tiny-gemma4",) if _compat.GEMMA4_SUPPORTED else ()
#: why a Gemma 4 preset is not among them
NO_ASSISTANT = {"gemma4-e2b-shape": "Gemma4AssistantConfig's default backbone_hidden_size (1536) does not match its "
                                    "target's hidden size (2304): the defaults describe no E2B target/assistant pair"}


def target_e2b(dtype: torch.dtype, device: str) -> Any:
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig

    text = Gemma4TextConfig(tie_word_embeddings=False)  # the published-config defaults, LM head untied
    config = Gemma4Config(text_config=text, vision_config=Gemma4VisionConfig(), audio_config=None,
                          tie_word_embeddings=False)
    return random_weights(Gemma4ForConditionalGeneration, config, dtype, device, pad_token_id=text.pad_token_id)


def draft_270m(dtype: torch.dtype, device: str) -> Any:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                              query_pre_attn_scalar=256, max_position_embeddings=32768, tie_word_embeddings=True)
    return random_weights(Gemma3ForCausalLM, config, dtype, device)


def build_gemma4_preset(name: str, device: str, dtype: str | None, seed: int, preset_cls: type) -> Any:
    if name == "gemma4-e2b-shape":
        dt = getattr(torch, dtype or "bfloat16")
        target = target_e2b(dt, device)
        boi = target.config.boi_token_id  # text ids below it (the image block's ids come after)
        return preset_cls(target, draft_270m(dt, device), 768, target.config.image_token_id, boi,
                          inputs=gemma4_inputs)
    from .. import testing

    target = testing.tiny_target("gemma4", seed=seed, eos_bias=-30.0).to(device, getattr(torch, dtype or "float32"))
    return preset_cls(target, testing.random_text_draft(target), testing.IMAGE_SIZE, target.config.image_token_id,
                      target.config.boi_token_id, inputs=gemma4_inputs)


def image_patches(vision: Any, image_size: int, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``pixel_values`` [batch, budget, 3·p²] and ``image_position_ids`` [batch, budget, 2] of one square image
    per row, as Gemma 4's image processor pads them (positions -1 past the image), and its soft-token count."""
    side = image_size // vision.patch_size
    budget = _MAX_SOFT_TOKENS * vision.pooling_kernel_size ** 2
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    positions = torch.full((budget, 2), -1, dtype=torch.long)
    positions[: side * side] = torch.stack([xs.flatten(), ys.flatten()], dim=-1)
    pixels = torch.zeros(batch, budget, 3 * vision.patch_size ** 2)
    pixels[:, : side * side] = torch.rand(batch, side * side, pixels.shape[-1], generator=gen)
    return pixels, positions.expand(batch, -1, -1).clone(), side * side // vision.pooling_kernel_size ** 2


def assistant_for(target: Any, seed: int) -> Any:
    """The ``gemma4_assistant`` draft of ``tiny-gemma4``: the test fixtures' two-layer assistant (hidden 32), seeded
    by ``seed`` alone, on the target's device and dtype."""
    from ..drafts.gemma4_assistant import tiny_assistant

    with torch.random.fork_rng(devices=[]):  # the assistant's init must not move the caller's random stream
        draft = tiny_assistant(target, seed=seed)
    return draft.to(target.device, next(target.parameters()).dtype)


def gemma4_inputs(preset: Any, batch: int, prompt_tokens: int, seed: int = 0, with_image: bool = True) -> dict:
    """Left-padded rows ``[<bos>, <|image>, <|image|>×n, <image|>, text...]`` with image patches."""
    gen = torch.Generator().manual_seed(seed)
    target = preset.target
    config = target.config
    first_text = 6  # after <pad> <eos> <bos> <unk> and the turn markers
    pixels, positions, n_image = image_patches(config.vision_config, preset.image_size, batch, gen)
    rows = []
    for i in range(batch):
        text = torch.randint(first_text, preset.text_vocab, (max(prompt_tokens - 3 * i, 4),), generator=gen).tolist()
        image = [config.boi_token_id] + [config.image_token_id] * n_image + [config.eoi_token_id]
        rows.append([config.get_text_config().bos_token_id] + (image if with_image else []) + text)
    ids, mask = left_padded(rows, int(target.generation_config.pad_token_id))
    inputs = {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == config.image_token_id).long()}
    if with_image:
        inputs["pixel_values"], inputs["image_position_ids"] = pixels, positions
    device, dtype = target.device, next(target.parameters()).dtype
    return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in inputs.items()}
