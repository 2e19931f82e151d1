"""Tiny Muse Glimmer fixture (``muse_glimmer``): the upstream layout scaled down.

Upstream (Muse-Glimmer-30B) uses a Llama-4-style tokenizer whose 202048 ids hold every special token (BPE
words, then the specials from 200000: ``<|begin_of_text|>`` 200000, ``<|end_of_text|>`` 200001 (EOS), the
pad 200018, ``<|video|>`` 200091, ``<|patch|>`` 200092). Scaled down: ``0`` ``<unk>`` (the word-level
tokenizer's), words up to 99, then ``100 <|begin_of_text|> 101 <|end_of_text|> 102 <|header_start|>
103 <|header_end|> 104 <|eot|> 105 <|finetune_right_pad|> 106 <|image_start|> 107 <|image_end|>
108 <|vid_start|> 109 <|vid_end|> 110 <|vid_frame_separator|> 111 <|video|> 112 <|patch|>``, rows to 128
(no rows past the tokenizer's specials, as upstream). EOS: ``<|end_of_text|>`` and ``<|eot|>`` (end of turn).

The text decoder keeps what makes the family: a normed embedding, gated attention with QK-norm, sandwich
norms, two sliding-window RoPE layers (window 16) then a full-attention NoPE layer, and soft-capped logits
scaled by ``output_multiplier``; the vision tower runs windowed and full attention on 4-pixel patches merged
2x2 (a 32x32 image is 16 ``<|patch|>`` tokens). transformers has no ``MuseGlimmerForCausalLM``:
:class:`MuseGlimmerTextLM` (the text decoder and its LM head, logits as the target's) is the text-only copy.
The image processor is a PIL one (upstream's needs torchvision) with upstream's patch layout.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import (
    BatchFeature,
    GenerationMixin,
    MuseGlimmerConfig,
    MuseGlimmerForConditionalGeneration,
    MuseGlimmerProcessor,
    MuseGlimmerTextConfig,
    PretrainedConfig,
    PreTrainedModel,
    ProcessorMixin,
)
from transformers.image_processing_backends import PilBackend
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerTextModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorKwargs

from .. import _compat
from .gemma3 import Gemma3Fixtures
from .layouts import NoVideo, Layout
from .registry import register_fixture
from .shaping import INIT_RANGE, language_model

PATCH, MERGE, TEMPORAL = 4, 2, 2
MUSE_LAYOUT = Layout(
    vocab_size=128, text_end=100, head=["<unk>"], tail_start=100,
    tail=["<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|header_end|>", "<|eot|>",
          "<|finetune_right_pad|>", "<|image_start|>", "<|image_end|>", "<|vid_start|>", "<|vid_end|>",
          "<|vid_frame_separator|>", "<|video|>", "<|patch|>"],
    pad="<|finetune_right_pad|>", eos=["<|end_of_text|>", "<|eot|>"], bos="<|begin_of_text|>", unk="<unk>",
    image="<|patch|>", marker="<|patch|>", draft_vocab=128)
OUTPUT_MULTIPLIER = 0.5  # upstream 1/sqrt(6656/256); the LM head is shaped for the logits after it


class MuseGlimmerTextLM(PreTrainedModel, GenerationMixin):
    """Muse Glimmer's text decoder with its LM head as a plain causal LM: logits
    ``softcap · tanh(lm_head(h) · output_multiplier / softcap)``, as ``MuseGlimmerForConditionalGeneration``
    computes them on text."""

    config_class = MuseGlimmerTextConfig
    base_model_prefix = "model"
    _supports_sdpa = True

    def __init__(self, config: MuseGlimmerTextConfig):
        super().__init__(config)
        self.model = MuseGlimmerTextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int = 0, **kwargs: Any) -> CausalLMOutputWithPast:
        cache = _compat.passed_cache(kwargs)  # ``cache`` from 5.24, ``past_key_values`` before
        kwargs = {k: v for k, v in kwargs.items() if k not in _compat.CACHE_KWARG_NAMES}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         inputs_embeds=inputs_embeds, use_cache=use_cache, **_compat.cache_kwargs(cache), **kwargs)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return CausalLMOutputWithPast(logits=self.logits(hidden), **_compat.cache_kwargs(_compat.output_cache(out)))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits of the decoder's output (Step3.7's text copy subclasses this with its own)."""
        cap = self.config.final_logit_softcapping
        return cap * torch.tanh(self.lm_head(hidden) * self.config.output_multiplier / cap)


class MuseGlimmerImageProcessorPil(PilBackend):
    """Muse Glimmer's patches without torchvision: every image kept at its size (a multiple of
    ``patch_size · merge_size``), each patch laid out (temporal, channel, row, column) as upstream's
    ``MuseGlimmerImageProcessor.patchify``; ``image_grid_thw`` rows ``[1, h / patch, w / patch]``."""

    do_resize = False
    do_rescale = True
    rescale_factor = 1 / 255
    do_normalize = True
    image_mean = [0.5, 0.5, 0.5]
    image_std = [0.5, 0.5, 0.5]
    do_convert_rgb = True
    patch_size, temporal_patch_size, merge_size = PATCH, TEMPORAL, MERGE
    valid_kwargs = Qwen2VLImageProcessorKwargs
    model_input_names = ["pixel_values", "image_grid_thw"]

    def _preprocess(self, images: list[np.ndarray], do_rescale: bool, rescale_factor: float, do_normalize: bool,
                    image_mean: Any, image_std: Any, return_tensors: Any, patch_size: int, temporal_patch_size: int,
                    merge_size: int, **kwargs: Any) -> BatchFeature:
        patches, grids = [], []
        for image in images:  # channels first
            channels, height, width = image.shape
            if height % (patch_size * merge_size) or width % (patch_size * merge_size):
                raise ValueError(f"the tiny Muse Glimmer processor keeps images at their size: {width}x{height} is not "
                                 f"a multiple of {patch_size * merge_size}")
            if do_rescale:
                image = self.rescale(image, rescale_factor)
            if do_normalize:
                image = self.normalize(image, image_mean, image_std)
            gh, gw = height // patch_size, width // patch_size
            grid = image.reshape(channels, gh, patch_size, gw, patch_size).transpose(1, 3, 0, 2, 4)
            grid = np.broadcast_to(grid[:, :, None], (gh, gw, temporal_patch_size, channels, patch_size, patch_size))
            patches.append(grid.reshape(gh * gw, -1))
            grids.append([1, gh, gw])
        return BatchFeature(data={"pixel_values": np.concatenate(patches).astype(np.float32),
                                  "image_grid_thw": np.array(grids)}, tensor_type=return_tensors)


class TinyMuseGlimmerProcessor(NoVideo, MuseGlimmerProcessor):
    pass


class MuseGlimmerFixtures(Gemma3Fixtures):
    """Built as the Gemma 3 fixture is shaped (sandwich norms with ``1 + w`` scales), plus Muse's attention
    gate (made constant on the bias channel), its plain final norm and the logit multiplier."""

    name = "muse_glimmer"
    group = "muse_glimmer"
    layout = MUSE_LAYOUT
    images_per_row = False  # the processor takes one flat list of images

    def model(self, seed: int) -> PreTrainedModel:
        ids = self.layout.ids()
        text = MuseGlimmerTextConfig(
            vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
            initializer_range=INIT_RANGE, sliding_window=16, attention_bias=True, qk_scale_factor=2.0,
            output_multiplier=OUTPUT_MULTIPLIER, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=ids["bos"], eos_token_id=ids["eos"][0], pad_token_id=ids["pad"], tie_word_embeddings=False)
        vision = dict(patch_size=PATCH, pos_emb_height=8, pos_emb_width=8, num_attention_heads=4, num_hidden_layers=2,
                      hidden_size=32, intermediate_size=64, patch_temporal=TEMPORAL, merge_size=MERGE,
                      max_position_embeddings=64, rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
        cfg = MuseGlimmerConfig(text_config=text.to_dict(), vision_config=vision, image_token_id=ids["image"],
                                video_token_id=self.layout.vocab()["<|video|>"], out_hidden_size=32 * MERGE ** 2,
                                projector_hidden_size=64, tie_word_embeddings=False)
        model = MuseGlimmerForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
        with torch.no_grad():
            for p in model.model.parameters():  # transformers' 0.02 init would make outputs context-free
                if p.dim() > 1:
                    p.normal_(0.0, INIT_RANGE)
            model.model.vision_projection.weight[0] = 0.0  # image features carry nothing on the bias channel
        return model

    @torch.no_grad()
    def shape(self, model: PreTrainedModel, eos_bias: float | None, gen: torch.Generator) -> None:
        decoder = language_model(model)
        decoder.layers[-1].self_attn.gate_proj.weight[0] = 0.0  # gate of value dim 0: sigmoid(0), constant
        super().shape(model, eos_bias, gen)
        model.lm_head.weight.div_(OUTPUT_MULTIPLIER)

    def final_norm_scale(self, decoder: nn.Module) -> torch.Tensor:
        return decoder.norm.weight  # a plain RMSNorm weight, not Gemma's 1 + w

    def causal_lm_config(self, target: PreTrainedModel) -> PretrainedConfig:
        return copy.deepcopy(target.config.text_config)

    def text_lm(self, config: PretrainedConfig, attn_implementation: str) -> PreTrainedModel:
        return MuseGlimmerTextLM._from_config(config, attn_implementation=attn_implementation)

    def processor(self, vocab_size: int) -> ProcessorMixin:
        tok = self.layout.tokenizer()
        return TinyMuseGlimmerProcessor(image_processor=MuseGlimmerImageProcessorPil(), tokenizer=tok,
                                        video_processor=None, chat_template=tok.chat_template)


MUSE_GLIMMER = register_fixture(MuseGlimmerFixtures())
