"""Tiny InternVL fixture (``internvl``): the Qwen2.5 tokenizer + ``<img> </img> <IMG_CONTEXT> <quad> </quad>
<ref> </ref> <box> </box>`` (InternVL3-hf's 151674 rows), scaled down.

Ids: ``0 <|endoftext|> 1 <|im_start|> 2 <|im_end|>``, words, ``119 <img> 120 </img> 121 <IMG_CONTEXT>
122..127``, ``V = 128``; the natural draft's vocabulary is LARGER (144, as Qwen2.5's 151936). Images are
cropped into up to 4 tiles of 32 px plus a thumbnail. (The InternVL processor wants a ``video_token``:
``<video>`` is added to the tokenizer as id 128, past the model's rows; the fixtures never use it.)

    >>> from hf_specmm.testing import internvl
    >>> internvl.INTERNVL.ids(0)["image"], internvl.INTERNVL.ids(0)["draft_vocab"]
    (121, 144)
"""

from __future__ import annotations

import torch
from transformers import (
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    PreTrainedModel,
    ProcessorMixin,
    Qwen2Config,
)
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
from transformers.models.internvl.configuration_internvl import InternVLVisionConfig

from .layouts import IMAGE_SIZE, PATCH_SIZE, TOKENS_PER_TILE, Layout, LayoutFixtures, NoVideo, llama_like
from .registry import register_fixture
from .shaping import BIAS_DIM, INIT_RANGE

INTERNVL_LAYOUT = Layout(
    vocab_size=128, text_end=119, head=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    tail=["<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>"],
    tail_start=119, pad="<|endoftext|>", eos=["<|im_end|>", "<|endoftext|>"], bos=None, unk="<|endoftext|>",
    image="<IMG_CONTEXT>", marker="<IMG_CONTEXT>", draft_vocab=144,
    extra_special_tokens={"start_image_token": "<img>", "end_image_token": "</img>",
                          "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})


class TinyInternVLProcessor(NoVideo, InternVLProcessor):
    """``InternVLProcessor`` accepting ``video_processor=None`` (images and text only)."""


class InternVLFixtures(LayoutFixtures):
    name = "internvl"
    group = "internvl"
    layout = INTERNVL_LAYOUT

    def model(self, seed: int) -> PreTrainedModel:
        ids = self.layout.ids()
        vision = InternVLVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      image_size=[IMAGE_SIZE, IMAGE_SIZE], patch_size=[PATCH_SIZE, PATCH_SIZE],
                                      initializer_range=INIT_RANGE)
        cfg = InternVLConfig(vision_config=vision, text_config=llama_like(Qwen2Config, self.layout, use_sliding_window=False),
                             image_token_id=ids["image"], image_seq_length=TOKENS_PER_TILE, downsample_ratio=0.5,
                             vision_feature_layer=-1, vision_feature_select_strategy="default",
                             tie_word_embeddings=False)
        model = InternVLForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
        with torch.no_grad():
            proj = model.model.multi_modal_projector.linear_2
            proj.weight[BIAS_DIM] = 0.0
            proj.bias[BIAS_DIM] = 0.0
        return model

    def processor(self, vocab_size: int) -> ProcessorMixin:
        tok = self.layout.tokenizer()
        ip = GotOcr2ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, crop_to_patches=True,
                                      min_patches=1, max_patches=4)
        return TinyInternVLProcessor(image_processor=ip, tokenizer=tok, video_processor=None,
                                     image_seq_length=TOKENS_PER_TILE, chat_template=tok.chat_template)


INTERNVL = register_fixture(InternVLFixtures())
