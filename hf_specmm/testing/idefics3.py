"""Tiny Idefics3 and SmolVLM fixtures (``idefics3``, ``smolvlm``): the SmolVLM tokenizer's layout scaled
down (SmolLM2's 49152 ids, then ``<global-img>``, the 36 ``<row_i_col_j>``, ``<fake_token_around_image>``,
``<image>`` ... ``<end_of_utterance>`` = 49279).

Ids: ``0 <|endoftext|> 1 <|im_start|> 2 <|im_end|>``, words, ``96 <global-img> 97..132 <row_i_col_j>
133 <fake_token_around_image> 134 <image> 135 <end_of_utterance>`` (EOS), ``V = 136``; the natural draft's
vocabulary is 96. Images are split into up to 2 x 2 tiles of 32 px plus a global view.

:func:`relaid_target` / :func:`relaid_processor` build a target and tokenizer laid out otherwise (the
layout tokens at ids 3..40, words in the 38 ids below ``<image>``), as a fine-tune with added tokens may be.

    >>> from hf_specmm.testing import idefics3
    >>> idefics3.SMOLVLM.ids(0)["image"], idefics3.SMOLVLM.ids(0)["draft_vocab"]
    (134, 96)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3Processor,
    LlamaConfig,
    PreTrainedModel,
    ProcessorMixin,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMProcessor,
)
from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.smolvlm.configuration_smolvlm import SmolVLMVisionConfig
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

from .layouts import IMAGE_SIZE, PATCH_SIZE, TOKENS_PER_TILE, Layout, LayoutFixtures, NoVideo, llama_like
from .registry import register_fixture
from .shaping import BIAS_DIM, INIT_RANGE

ROW_COL = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
LAYOUT_TOKENS = ["<global-img>", *ROW_COL, "<fake_token_around_image>"]
SMOLVLM_LAYOUT = Layout(
    vocab_size=136, text_end=96, head=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    tail=[*LAYOUT_TOKENS, "<image>", "<end_of_utterance>"], tail_start=96, pad="<|endoftext|>",
    eos=["<end_of_utterance>"], bos=None, unk="<|endoftext|>", image="<image>", marker="<image>", draft_vocab=96)
# A tokenizer laid out otherwise (as a fine-tune with added tokens may be): <image> and <end_of_utterance> at
# the same ids, the layout tokens right after the first three specials, and ordinary words in the 38 ids
# below <image>, where the SmolVLM layout has its layout tokens
RELAID_LAYOUT = dataclasses.replace(
    SMOLVLM_LAYOUT, head=[*SMOLVLM_LAYOUT.head, *LAYOUT_TOKENS], tail=["<image>", "<end_of_utterance>"],
    tail_start=134, text_end=134, reserved_head=len(LAYOUT_TOKENS))


def _no_num2words(n: int) -> str:
    raise RuntimeError("video prompts need the num2words package")


class TinySmolVLMProcessor(NoVideo, SmolVLMProcessor):
    """``SmolVLMProcessor`` accepting ``video_processor=None`` (images and text only).

    The real processor refuses to start without the ``num2words`` package, which only its video prompts
    use; with no video processor here, a stand-in that raises lets it start where that package is absent.
    """

    def __init__(self, image_processor: Any, tokenizer: Any, video_processor: Any = None, image_seq_len: int = 169,
                 chat_template: str | None = None, **kwargs: Any):
        from transformers.models.smolvlm import processing_smolvlm as module

        args = (image_processor, tokenizer, video_processor, image_seq_len, chat_template)
        if module.num2words is not None:
            super().__init__(*args, **kwargs)
            return
        module.num2words = _no_num2words
        try:
            super().__init__(*args, **kwargs)
        finally:
            module.num2words = None


class Idefics3Fixtures(LayoutFixtures):
    name = "idefics3"
    group = "idefics3"
    layout = SMOLVLM_LAYOUT
    classes: tuple[type, type, type] = (Idefics3VisionConfig, Idefics3Config, Idefics3ForConditionalGeneration)

    def model(self, seed: int) -> PreTrainedModel:
        ids = self.layout.ids()
        vis_cls, cfg_cls, model_cls = self.classes
        vision = vis_cls(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, initializer_range=INIT_RANGE)
        cfg = cfg_cls(text_config=llama_like(LlamaConfig, self.layout, attention_bias=True), vision_config=vision,
                      scale_factor=2, image_token_id=ids["image"], tie_word_embeddings=False, pad_token_id=ids["pad"])
        model = model_cls._from_config(cfg, attn_implementation="sdpa")
        with torch.no_grad():
            model.model.connector.modality_projection.proj.weight[BIAS_DIM] = 0.0
        return model

    def processor(self, vocab_size: int) -> ProcessorMixin:
        tok = self.layout.tokenizer()
        ip = Idefics3ImageProcessorPil(**self.image_kwargs())
        return Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=TOKENS_PER_TILE,
                                 chat_template=tok.chat_template)

    @staticmethod
    def image_kwargs() -> dict[str, Any]:
        return dict(size={"longest_edge": 2 * IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE},
                    do_image_splitting=True)


class SmolVLMFixtures(Idefics3Fixtures):
    name = "smolvlm"
    classes = (SmolVLMVisionConfig, SmolVLMConfig, SmolVLMForConditionalGeneration)

    def processor(self, vocab_size: int) -> ProcessorMixin:
        tok = self.layout.tokenizer()
        return TinySmolVLMProcessor(image_processor=SmolVLMImageProcessorPil(**self.image_kwargs()), tokenizer=tok,
                                    video_processor=None, image_seq_len=TOKENS_PER_TILE,
                                    chat_template=tok.chat_template)


IDEFICS3 = register_fixture(Idefics3Fixtures())
SMOLVLM = register_fixture(SmolVLMFixtures())


class _Relaid:
    """The family's fixtures over :data:`RELAID_LAYOUT` (not registered: the family's name stays its own)."""

    layout = RELAID_LAYOUT


class RelaidIdefics3(_Relaid, Idefics3Fixtures):
    pass


class RelaidSmolVLM(_Relaid, SmolVLMFixtures):
    pass


_RELAID = {"idefics3": RelaidIdefics3(), "smolvlm": RelaidSmolVLM()}


def relaid_target(family: str = "smolvlm", seed: int = 0, eos_bias: float | None = None) -> PreTrainedModel:
    """The tiny target of ``family`` for :data:`RELAID_LAYOUT`: the same ``<image>`` and EOS ids, its LM
    never writes the layout tokens at ids 3..40 and writes words in the 38 ids below ``<image>``."""
    return _RELAID[family].seeded_target(seed, 0, eos_bias)


def relaid_processor(family: str = "smolvlm") -> ProcessorMixin:
    """The family's processor over :data:`RELAID_LAYOUT` (see :func:`relaid_target`)."""
    return _RELAID[family].processor(0)
