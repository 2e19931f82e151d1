"""Step3.7 benchmark preset (no download; where hf_specmm registers Step3.7, see
``_compat.STEP3P7_SUPPORTED``): ``tiny-step3.7``, the test fixtures' tiny
Step3.7 target (sliding-window and full layers, a MoE layer, gated attention) with its random text draft.

Synthetic prompts: per row one image's global view (``<im_patch>×n``, n = (image size / 16)² for the ViT's
patches and its two stride-2 downsamplers; no local crops) then random text ids, left-padded.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from .. import _compat
from .shapes import left_padded

_AVAILABLE = _compat.STEP3P7_SUPPORTED and hasattr(transformers, "Step3p7ForConditionalGeneration")
STEP3P7_PRESETS = ("tiny-step3.7",) if _AVAILABLE else ()


def build_step3p7_preset(name: str, device: str, dtype: str | None, seed: int, preset_cls: type) -> Any:
    from .. import testing
    from ..testing import step3p7 as fixtures

    target = testing.tiny_target("step3p7", seed=seed, eos_bias=-30.0).to(device, getattr(torch, dtype or "float32"))
    ids = fixtures.STEP3P7_LAYOUT.ids()
    return preset_cls(target, testing.random_text_draft(target), fixtures.IMAGE, ids["image"], ids["text_end"],
                      inputs=step3p7_inputs)


def step3p7_inputs(preset: Any, batch: int, prompt_tokens: int, seed: int = 0, with_image: bool = True) -> dict:
    """Left-padded rows ``[<im_patch>×n, text...]`` with one global view per row."""
    gen = torch.Generator().manual_seed(seed)
    target = preset.target
    side = preset.image_size // (target.config.vision_config.patch_size * 4)  # two stride-2 downsamplers
    n_image = side * side if with_image else 0
    rows = []
    for i in range(batch):
        text = torch.randint(3, preset.text_vocab, (max(prompt_tokens - 3 * i, 4),), generator=gen).tolist()
        rows.append([target.config.image_token_id] * n_image + text)
    ids, mask = left_padded(rows, int(target.generation_config.pad_token_id))
    inputs = {"input_ids": ids, "attention_mask": mask}
    if with_image:
        inputs["pixel_values"] = torch.randn(batch, 3, preset.image_size, preset.image_size, generator=gen)
    device, dtype = target.device, next(target.parameters()).dtype
    return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in inputs.items()}
