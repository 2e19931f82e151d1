"""Tiny LLaVA fixtures: LLaVA-1.5 (``llava``), LLaVA-NeXT anyres (``llava_next``), LLaVA-OneVision
(``llava_onevision``).

2-layer / hidden-64 LM (Llama, or Qwen2 for onevision), 2-layer / hidden-32 vision tower (CLIP, or SigLIP
for onevision) on 32x32 images with 8x8 patches. Id layout (``V = vocab_size``), mimicking LLaVA-1.5
(``<image>`` / ``<pad>`` appended after the text vocabulary):

* ``0`` ``<unk>``, ``1`` ``<s>`` (bos), ``2`` ``</s>`` (eos), ``3 .. V-5`` plain words;
* ``V-4`` ``<image>``, ``V-3`` ``<video>`` (onevision; ``<reserved_0>`` otherwise), ``V-2`` ``<pad>``,
  ``V-1`` ``<reserved_1>``.

Ids ``>= V-4`` are *reserved*: the language models built here never predict them (logit about -20, see
:mod:`~hf_specmm.testing.shaping`). The natural text draft has the ``V - 4`` text ids (Vicuna's 32000 of
LLaVA-1.5's 32064).

    >>> from hf_specmm.testing import llava
    >>> llava.LLAVA.ids(128)["image"], llava.LLAVA.ids(128)["pad"]
    (124, 126)
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    CLIPVisionConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionProcessor,
    LlavaProcessor,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    SiglipVisionConfig,
)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
    LlavaOnevisionImageProcessorPil,
)

from .registry import FixtureFamily, register_fixture
from .shaping import BIAS_DIM, BOS_ID, EOS_ID, UNK_ID, finish, language_model, shape_lm, small_lm_config, words

IMAGE_SIZE = 32
PATCH_SIZE = 8
GRID_PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64]]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image> {% elif c['type'] == 'video' %}<video> "
    "{% elif c['type'] == 'text' %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}"
    "{% if m['role'] == 'assistant' %} </s>{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               image_size=IMAGE_SIZE, patch_size=PATCH_SIZE)
_IMAGE_KW = dict(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})


class TinyOnevisionProcessor(LlavaOnevisionProcessor):
    """``LlavaOnevisionProcessor`` that accepts ``video_processor=None``.

    The onevision video processor needs torchvision; images and text work without it.
    """

    def check_argument_for_proper_class(self, argument_name: str, argument: object) -> type | None:
        if argument is None and argument_name == "video_processor":
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


class LlavaFixtures(FixtureFamily):
    """LLaVA-1.5; :class:`LlavaNextFixtures` and :class:`OnevisionFixtures` change the config and processor."""

    name = "llava"
    group = "llava"
    qwen2_lm = False  # onevision: a Qwen2 LM whose tokenizer prepends no <s>
    video_token = "<reserved_0>"

    def ids(self, vocab_size: int) -> dict[str, Any]:
        v = vocab_size
        return {"unk": UNK_ID, "bos": BOS_ID, "eos": [EOS_ID], "image": v - 4, "video": v - 3, "pad": v - 2}

    def natural_draft_vocab(self, target: PreTrainedModel) -> int:
        return target.config.get_text_config().vocab_size - 4

    def model(self, text: Any, common: dict[str, Any]) -> PreTrainedModel:
        n_img = (IMAGE_SIZE // PATCH_SIZE) ** 2
        cfg = LlavaConfig(vision_config=CLIPVisionConfig(projection_dim=32, **_VISION), image_seq_length=n_img,
                          vision_feature_select_strategy="default", vision_feature_layer=-2, **common)
        return LlavaForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")

    def target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
        ids = self.special_ids(vocab_size)
        text = small_lm_config(self.qwen2_lm, vocab_size, ids["bos"], ids["eos"], ids["pad"])
        model = self.model(text, dict(text_config=text, image_token_index=ids["image"], projector_hidden_act="gelu",
                                      multimodal_projector_bias=True, tie_word_embeddings=False, pad_token_id=ids["pad"]))
        with torch.no_grad():  # image features / newline carry nothing in the bias channel
            proj = model.model.multi_modal_projector.linear_2
            proj.weight[BIAS_DIM] = 0.0
            proj.bias[BIAS_DIM] = 0.0
            newline = getattr(model.model, "image_newline", None)
            if newline is not None:
                newline[BIAS_DIM] = 0.0
        gen = torch.Generator().manual_seed(seed + 1000)
        reserved = list(range(vocab_size - 4, vocab_size))
        shape_lm(language_model(model), model.lm_head, vocab_size, reserved, eos_bias, gen)
        return finish(model, ids["pad"])

    def tokenizer(self, vocab_size: int) -> PreTrainedTokenizerFast:
        ids = self.special_ids(vocab_size)
        specials = {"<unk>": UNK_ID, "<s>": BOS_ID, "</s>": EOS_ID, "<image>": ids["image"],
                    self.video_token: ids["video"], "<pad>": ids["pad"], "<reserved_1>": vocab_size - 1}
        vocab = dict(specials)
        vocab.update({w: 3 + i for i, w in enumerate(words(vocab_size - 4 - 3))})
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.add_special_tokens(sorted(specials, key=specials.get))
        if not self.qwen2_lm:  # Llama-style tokenizers prepend <s>; Qwen2 does not
            tok.post_processor = processors.TemplateProcessing(
                single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
            padding_side="left", model_max_length=4096, chat_template=CHAT_TEMPLATE)

    def processor(self, vocab_size: int) -> ProcessorMixin:
        return LlavaProcessor(image_processor=CLIPImageProcessorPil(**_IMAGE_KW), tokenizer=self.tokenizer(vocab_size),
                              patch_size=PATCH_SIZE, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)


class LlavaNextFixtures(LlavaFixtures):
    name = "llava_next"

    def model(self, text: Any, common: dict[str, Any]) -> PreTrainedModel:
        cfg = LlavaNextConfig(vision_config=CLIPVisionConfig(projection_dim=32, **_VISION),
                              image_grid_pinpoints=GRID_PINPOINTS, vision_feature_select_strategy="default",
                              vision_feature_layer=-2, **common)
        return LlavaNextForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")

    def processor(self, vocab_size: int) -> ProcessorMixin:
        ip = LlavaNextImageProcessorPil(image_grid_pinpoints=GRID_PINPOINTS, **_IMAGE_KW)
        return LlavaNextProcessor(image_processor=ip, tokenizer=self.tokenizer(vocab_size), patch_size=PATCH_SIZE,
                                  vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                  chat_template=CHAT_TEMPLATE)


class OnevisionFixtures(LlavaFixtures):
    name = "llava_onevision"
    qwen2_lm = True
    video_token = "<video>"

    def model(self, text: Any, common: dict[str, Any]) -> PreTrainedModel:
        cfg = LlavaOnevisionConfig(vision_config=SiglipVisionConfig(**_VISION),
                                   video_token_index=common["text_config"].vocab_size - 3,
                                   image_grid_pinpoints=GRID_PINPOINTS, vision_feature_select_strategy="full",
                                   vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9", **common)
        return LlavaOnevisionForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")

    def processor(self, vocab_size: int) -> ProcessorMixin:
        ip = LlavaOnevisionImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                             image_grid_pinpoints=GRID_PINPOINTS)
        return TinyOnevisionProcessor(image_processor=ip, tokenizer=self.tokenizer(vocab_size), video_processor=None,
                                      num_image_tokens=(IMAGE_SIZE // PATCH_SIZE) ** 2,
                                      vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
                                      chat_template=CHAT_TEMPLATE)


LLAVA = register_fixture(LlavaFixtures())
LLAVA_NEXT = register_fixture(LlavaNextFixtures())
LLAVA_ONEVISION = register_fixture(OnevisionFixtures())
