"""The miniature world's target: a tiny LLaVA-1.5-shaped model (SigLIP vision tower → MLP projector → Llama)
and its processor, built from configs with the world tokenizer, then trained from scratch on world answers.

Example::

    >>> from hf_specmm.world.target import WorldTargetConfig, build_world_processor, build_world_target
    >>> cfg = WorldTargetConfig()
    >>> model, processor = build_world_target(cfg), build_world_processor(cfg)
    >>> processor.tokenizer("what color is the circle ?")["input_ids"][:2]
    [1, 71]
    >>> sum(p.numel() for p in model.parameters()) > 10**6
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from transformers import (GenerationConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor,
                          SiglipVisionConfig)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from .tokenizer import IMAGE_TOKEN, build_world_tokenizer

# Longest world answer + EOS fits (37 tokens); the target's own default, and what the recipe, the accuracy
# evaluation, the demo and the τ table generate.
MAX_ANSWER_TOKENS = 48

# One user turn rendered as the raw prompt the target was trained on: "<image> " per image, then the text
# (what ``train.data.format_prompt`` writes with ``"raw"``), so chat clients such as lmms-eval's
# ``huggingface`` model send exactly the trained prompt. The world has no system or assistant turns.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] != 'user' -%}"
    "{{ raise_exception('the world target answers one user turn; got a ' + message['role'] + ' message') }}"
    "{%- endif -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<image> ' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}"
    "{%- else -%}{{ raise_exception('the world target reads images and text, not ' + item['type']) }}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}"
)


@dataclass(frozen=True)
class WorldTargetConfig:
    """Sizes of the world target. 48-pixel images in 16-pixel patches: one image token per grid cell.

    The vision tower is SigLIP-shaped, not CLIP: CLIP's LayerNorm right after the patch embedding removes
    the scale of a patch's embedding, i.e. how many pixels of a colour the cell holds, which is what tells
    size and shape apart here. With a CLIP tower the same recipe plateaued at 0.63 VQA / 0.08 caption exact
    match (colours and positions right, shapes and sizes wrong) even after 3000 steps.
    """

    image_size: int = 48
    patch_size: int = 16
    vision_hidden: int = 128
    vision_layers: int = 3
    vision_heads: int = 4
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 512
    max_positions: int = 256

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def build_world_processor(cfg: WorldTargetConfig = WorldTargetConfig()) -> LlavaProcessor:
    """A real ``LlavaProcessor``: world tokenizer + PIL CLIP image processor (no torchvision needed; the
    tower is SigLIP-shaped, the normalisation only has to be the same in training and use).

    Prompts are ``"<image> " + question`` and the answer follows directly; the chat template
    (``CHAT_TEMPLATE``) renders a user turn as exactly that.
    """
    size = cfg.image_size
    images = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return LlavaProcessor(image_processor=images, tokenizer=build_world_tokenizer(), patch_size=cfg.patch_size,
                          vision_feature_select_strategy="full", num_additional_image_tokens=0,
                          chat_template=CHAT_TEMPLATE)


def build_world_target(cfg: WorldTargetConfig = WorldTargetConfig(), seed: int = 0) -> LlavaForConditionalGeneration:
    """A randomly initialised world target (float32, eval mode); its init depends on ``seed`` only."""
    tok = build_world_tokenizer()
    image_id, pad_id = tok.convert_tokens_to_ids(IMAGE_TOKEN), tok.pad_token_id
    text = LlamaConfig(vocab_size=len(tok), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                       num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
                       max_position_embeddings=cfg.max_positions, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=pad_id, tie_word_embeddings=False)
    vision = SiglipVisionConfig(hidden_size=cfg.vision_hidden, intermediate_size=4 * cfg.vision_hidden,
                                num_hidden_layers=cfg.vision_layers, num_attention_heads=cfg.vision_heads,
                                image_size=cfg.image_size, patch_size=cfg.patch_size, vision_use_head=False)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id,
                         image_seq_length=cfg.image_tokens, vision_feature_select_strategy="full",  # no CLS token
                         vision_feature_layer=-1,  # the last layer: a from-scratch tower has nothing to skip
                         projector_hidden_act="gelu", tie_word_embeddings=False, pad_token_id=pad_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration._from_config(config, attn_implementation="sdpa")
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=pad_id, max_new_tokens=MAX_ANSWER_TOKENS,
                                               do_sample=False)
    return model.eval()
