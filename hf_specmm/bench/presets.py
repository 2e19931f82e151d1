"""Benchmark presets built from configs (random weights, no download).

- ``cpu-proxy``: LLaVA-shaped target, Llama LM of ~325M parameters (hidden 1024, 20 layers), a small
  CLIP tower (64 image tokens), fp32; draft: ~18M-parameter Llama with the target's 32064-row vocab
  (so stock assisted generation can run it too).
- ``llava-1.5-7b-shape``: the exact LLaVA-1.5-7B configuration (CLIP ViT-L/14-336, Vicuna-7B, 576
  image tokens), bf16, with a llama-68m-shaped draft (32000 ids, as double7/vicuna-68m).
- ``tiny``: the test fixtures' tiny LLaVA with a same-vocabulary random draft, for smoke tests.

Every preset's target follows the margin rule (:func:`~hf_specmm.bench.margin_rule.apply_margin_rule`): its
greedy pick wins by far more than bf16 rounding, so controlled acceptance is valid in bf16/fp16 too.

``device_map="auto"`` spreads the target's layers as ``from_pretrained(..., device_map="auto")`` does
(accelerate: balanced over the visible GPUs, then CPU RAM), for targets larger than one GPU; the draft
stays on ``device``.
- ``qwen2.5-vl-7b-shape`` / ``tiny-qwen2.5-vl``: Qwen2.5-VL-7B with a Qwen2.5-0.5B-shaped draft, and its
  tiny test version (``presets_qwen.py``).
- ``gemma4-e2b-shape`` / ``tiny-gemma4`` (transformers 5.24): Gemma 4 E2B-shaped with a Gemma 3 270M-shaped
  draft, and its tiny test version (``presets_gemma4.py``).
- ``qwen3.5-9b-shape`` / ``tiny-qwen3.5``: the hybrid Qwen3.5-9B with a Qwen3.5-0.8B-text-LM-shaped draft, and
  its tiny test version (``presets_qwen3_5.py``; where transformers has Qwen3.5).
- ``llava-onevision-1.5-8b-shape`` / ``ovis2.5-9b-shape`` / ``tiny-llava-onevision-1.5`` / ``tiny-ovis2.5``
  (transformers 5.25): LLaVA-OneVision-1.5-8B and Ovis2.5-9B with a Qwen3-0.6B-shaped draft, and their tiny
  test versions (``presets_ovis_onevision.py``).
- ``tiny-step3.7`` (transformers 5.25): the tiny Step3.7 test target and its random text draft
  (``presets_step3p7.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlamaForCausalLM, LlavaConfig, LlavaForConditionalGeneration

from ..devices import execution_device
from .margin_rule import apply_margin_rule
from .presets_gemma4 import GEMMA4_PRESETS, build_gemma4_preset
from .presets_ovis_onevision import ONEVISION_OVIS_PRESETS, build_onevision_ovis_preset
from .presets_qwen import QWEN_PRESETS, build_qwen_preset
from .presets_qwen3_5 import QWEN3_5_PRESETS, build_qwen3_5_preset
from .presets_step3p7 import STEP3P7_PRESETS, build_step3p7_preset
from .shapes import left_padded, random_weights


@dataclass
class Preset:
    target: Any
    draft: Any
    image_size: int
    image_token_id: int
    text_vocab: int  # ordinary text ids are [0, text_vocab)
    inputs: Callable[..., dict] | None = None  # the family's synthetic prompts (default: LLaVA's, below)


def _llava(text: LlamaConfig, vision: CLIPVisionConfig, dtype: torch.dtype, device: str) -> Any:
    config = LlavaConfig(text_config=text, vision_config=vision, image_token_index=32000, pad_token_id=32001,
                         vision_feature_layer=-2, vision_feature_select_strategy="default")
    return random_weights(LlavaForConditionalGeneration, config, dtype, device, pad_token_id=32001)


def _draft(hidden: int, layers: int, heads: int, intermediate: int, vocab: int, dtype: torch.dtype, device: str) -> Any:
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, intermediate_size=intermediate, max_position_embeddings=2048)
    return random_weights(LlamaForCausalLM, config, dtype, device)


DEVICE_MAPS = ("auto",)
# drafts the bench builds without a download, named as their draft kinds: the preset's small LM (the one
# stock assisted generation can run too), a random one-layer feature head, a random one-layer DFlash drafter,
# (Gemma 4 presets whose target shares K/V: :data:`ASSISTANT_PRESETS`) a random Gemma 4 assistant, and a random MTP
# layer of the target's own shape (what a Qwen3.5 checkpoint carries)
SMALL_LM = "text_only"
GEMMA4_ASSISTANT = "gemma4_assistant"
DRAFT_KINDS = (SMALL_LM, "feature_head", "dflash", GEMMA4_ASSISTANT, "mtp")
#: the bench's DFlash drafter reads blocks of this size (γ up to 15; stock's MuseGlimmerAssistantConfig default)
DFLASH_BLOCK = 16


def dispatch(model: Any, device_map: str) -> Any:
    """``model`` (built on the CPU) spread over the devices by accelerate's dispatch hooks, the way
    ``from_pretrained(..., device_map="auto")`` places a checkpoint (no layer split across devices)."""
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    if device_map not in DEVICE_MAPS:
        raise ValueError(f"unknown device_map {device_map!r}; choose one of {DEVICE_MAPS}")
    no_split = sorted(getattr(model, "_no_split_modules", None) or [])
    memory = get_balanced_memory(model, no_split_module_classes=no_split)
    placement = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split)
    return dispatch_model(model, placement)


def build_preset(name: str, device: str = "cpu", dtype: str | None = None, seed: int = 0,
                 device_map: str | None = None) -> Preset:
    """Build ``name``'s target and draft (seeded). ``device_map="auto"``: the target is built on the CPU and
    dispatched over the visible devices (see :func:`dispatch`); the draft goes to ``device``."""
    preset = _build(name, device if device_map is None else "cpu", dtype, seed)
    # in every dtype, so fp32 and bf16 rows time the same model: greedy margins far above bf16 rounding keep
    # the replayed reference valid in half precision (see margins.py; `greedy_margins` checks it)
    apply_margin_rule(preset.target, preset.text_vocab, seed)
    if device_map is not None:
        preset.target = dispatch(preset.target, device_map)
        preset.draft = preset.draft.to(device)
    return preset


def _build(name: str, device: str, dtype: str | None, seed: int) -> Preset:
    torch.manual_seed(seed)
    if name == "cpu-proxy":
        dt = getattr(torch, dtype or "float32")
        text = LlamaConfig(vocab_size=32064, hidden_size=1024, intermediate_size=2816, num_hidden_layers=20,
                           num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)
        vision = CLIPVisionConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=112, patch_size=14, projection_dim=128)
        return Preset(_llava(text, vision, dt, device), _draft(256, 4, 4, 704, 32064, dt, device), 112, 32000, 32000)
    if name == "llava-1.5-7b-shape":
        dt = getattr(torch, dtype or "bfloat16")
        text = LlamaConfig(vocab_size=32064, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                           rms_norm_eps=1e-5)
        vision = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                  num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768)
        return Preset(_llava(text, vision, dt, device), _draft(768, 2, 12, 3072, 32000, dt, device), 336, 32000, 32000)
    if name == "tiny":
        from .. import testing

        target = testing.tiny_target("llava", seed=seed, eos_bias=-30.0).to(device, getattr(torch, dtype or "float32"))
        vocab = target.config.text_config.vocab_size
        image = testing.special_ids(vocab)["image"]
        # same vocabulary as the target, so stock assisted generation can run it at batch 1
        return Preset(target, testing.random_text_draft(target), testing.IMAGE_SIZE, image, image)
    if name in QWEN_PRESETS:
        return build_qwen_preset(name, device, dtype, seed, Preset)
    if name in GEMMA4_PRESETS:
        return build_gemma4_preset(name, device, dtype, seed, Preset)
    if name in QWEN3_5_PRESETS:
        return build_qwen3_5_preset(name, device, dtype, seed, Preset)
    if name in ONEVISION_OVIS_PRESETS:
        return build_onevision_ovis_preset(name, device, dtype, seed, Preset)
    if name in STEP3P7_PRESETS:
        return build_step3p7_preset(name, device, dtype, seed, Preset)
    raise ValueError(f"unknown preset {name!r}; choose one of {PRESETS}")


PRESETS = ("cpu-proxy", "llava-1.5-7b-shape", "tiny") + QWEN_PRESETS + GEMMA4_PRESETS + QWEN3_5_PRESETS
PRESETS += ONEVISION_OVIS_PRESETS + STEP3P7_PRESETS


def synthetic_inputs(preset: Preset, batch: int, prompt_tokens: int, seed: int = 0, with_image: bool = True) -> dict:
    """Left-padded rows: [bos, <image>×n, text...] with row lengths differing by a few tokens."""
    if preset.inputs is not None:
        return preset.inputs(preset, batch, prompt_tokens, seed, with_image)
    gen = torch.Generator().manual_seed(seed)
    target = preset.target
    vision = target.config.vision_config
    n_image = (vision.image_size // vision.patch_size) ** 2 if with_image else 0
    rows = []
    for i in range(batch):
        text = torch.randint(3, preset.text_vocab, (max(prompt_tokens - 3 * i, 4),), generator=gen).tolist()
        rows.append([1] + [preset.image_token_id] * n_image + text)
    ids, mask = left_padded(rows, target.generation_config.pad_token_id)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if with_image:
        inputs["pixel_values"] = torch.randn(batch, 3, vision.image_size, vision.image_size, generator=gen)
    device, dtype = execution_device(target), next(target.parameters()).dtype
    return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in inputs.items()}
