"""Tiny Gemma 3 fixture (``gemma3``): the Gemma tokenizer's layout scaled down, a full-attention layer then
two sliding-window layers (window 16), a SigLIP tower on 32x32 images (4 soft tokens each).

Ids (the image soft token appended after the text vocabulary, rows padded as gemma-3-4b's 262208):
``0 <pad> 1 <eos> 2 <bos> 3 <unk> 4 <start_of_turn> 5 <end_of_turn>``, words, ``100 <start_of_image>
101 <end_of_image>`` (inside the text vocabulary, as 255999/256000), ``128 <image_soft_token>`` (= the
natural draft's vocabulary size, as 262144), ``V = 136``. EOS: ``<eos>`` and ``<end_of_turn>``.

    >>> from hf_specmm.testing import gemma3
    >>> gemma3.GEMMA3.ids(0)["eos"]
    [1, 5]
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3Processor,
    Gemma3TextConfig,
    PreTrainedModel,
    ProcessorMixin,
    SiglipVisionConfig,
)
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

from .layouts import IMAGE_SIZE, PATCH_SIZE, TOKENS_PER_TILE, Layout, LayoutFixtures
from .registry import register_fixture
from .shaping import (
    BIAS_DIM,
    BIAS_RATIO,
    INIT_RANGE,
    LOGIT_STD,
    RESERVED_LOGIT,
    bias_channel_value,
    language_model,
    other_channels_norm,
)

GEMMA3_LAYOUT = Layout(
    vocab_size=136, text_end=128, head=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
    inner={"<start_of_image>": 100, "<end_of_image>": 101}, tail=["<image_soft_token>"], tail_start=128,
    pad="<pad>", eos=["<eos>", "<end_of_turn>"], bos="<bos>", unk="<unk>", image="<image_soft_token>",
    marker="<start_of_image>", draft_vocab=128,
    extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                          "image_token": "<image_soft_token>"})


class Gemma3Fixtures(LayoutFixtures):
    name = "gemma3"
    group = "gemma3"
    layout = GEMMA3_LAYOUT

    def model(self, seed: int) -> PreTrainedModel:
        ids, vocab = self.layout.ids(), self.layout.vocab()
        text = Gemma3TextConfig(
            vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
            max_position_embeddings=1024, initializer_range=INIT_RANGE, sliding_window=16, attention_bias=True,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"], tie_word_embeddings=False)
        vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    image_size=IMAGE_SIZE, patch_size=PATCH_SIZE)
        cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=TOKENS_PER_TILE,
                           boi_token_index=vocab["<start_of_image>"], eoi_token_index=vocab["<end_of_image>"],
                           image_token_index=ids["image"], initializer_range=INIT_RANGE, tie_word_embeddings=False)
        model = Gemma3ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
        with torch.no_grad():  # transformers initialises this projection to zeros: images would carry nothing
            proj = model.model.multi_modal_projector.mm_input_projection_weight
            proj.normal_(0.0, INIT_RANGE)
            proj[:, BIAS_DIM] = 0.0
        return model

    @torch.no_grad()
    def shape(self, model: PreTrainedModel, eos_bias: float | None, gen: torch.Generator) -> None:
        """Gemma's post-norms rescale what a layer writes, so the bias channel is written by the last
        layer's attention alone (its other output channels zeroed: its post-norm then outputs a constant)
        and every other sub-layer's post-norm drops channel ``BIAS_DIM`` (Gemma norms scale by ``1 + weight``)."""
        ids, d = self.layout.ids(), BIAS_DIM
        decoder, lm_head = language_model(model), model.lm_head
        decoder.embed_tokens.weight[:, d] = 0.0
        for layer in decoder.layers:
            layer.post_attention_layernorm.weight[d] = -1.0
            layer.post_feedforward_layernorm.weight[d] = -1.0
        attn = decoder.layers[-1].self_attn
        attn.v_proj.weight[0] = 0.0
        attn.v_proj.bias[0] = 1.0
        attn.o_proj.weight.zero_()
        attn.o_proj.bias.zero_()
        attn.o_proj.weight[d, 0] = 1.0
        seen: dict[str, torch.Tensor] = {}
        hook = decoder.norm.register_forward_hook(lambda mod, args, out: seen.update(x=args[0]))
        decoder(input_ids=torch.randint(6, ids["text_end"], (4, 48), generator=gen), use_cache=False)
        hook.remove()
        x = seen["x"]
        rest = torch.cat([x[..., :d], x[..., d + 1:]], dim=-1).norm(dim=-1).max().item()
        hidden = lm_head.weight.shape[1]
        decoder.layers[-1].post_attention_layernorm.weight[d] = BIAS_RATIO * rest / hidden ** 0.5 - 1.0
        h0 = bias_channel_value(hidden)
        scale = self.final_norm_scale(decoder)
        w = lm_head.weight
        w.copy_(torch.randn(w.shape, generator=gen) * (LOGIT_STD / other_channels_norm(hidden)) / scale)
        w[:, d] = 0.0
        for r in ids["reserved"]:
            w[r] = 0.0
            w[r, d] = RESERVED_LOGIT / h0 / scale[d]
        if eos_bias is not None:
            for e in ids["eos"]:
                w[e, d] = eos_bias / h0 / scale[d]

    def final_norm_scale(self, decoder: torch.nn.Module) -> torch.Tensor:
        """What the final norm multiplies the normed hidden state by (Gemma: ``1 + weight``)."""
        return 1.0 + decoder.norm.weight

    def processor(self, vocab_size: int) -> ProcessorMixin:
        tok = self.layout.tokenizer()
        ip = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
        return Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=TOKENS_PER_TILE,
                               chat_template=tok.chat_template)


GEMMA3 = register_fixture(Gemma3Fixtures())
