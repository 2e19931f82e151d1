"""Tiny offline Qwen3.5 fixtures (transformers 5.17 to 5.25): the real ``Qwen3_5ForConditionalGeneration`` class, its
hybrid decoder scaled down (``linear_attention`` ×3 then ``full_attention``, the real 1-in-4 pattern; Gated
DeltaNet with 2 key heads and 4 value heads, the real 1:2 ratio; gated attention, partial rotary, interleaved
M-RoPE) and the Qwen-VL fixtures' token layout (:mod:`hf_specmm.testing.qwen_vl`).

Id layout: Qwen3.5's tokenizer puts the same specials in the same order as Qwen2/3's, from 248,044
(``<|vision_start|>`` 248,053, ``<|image_pad|>`` 248,056) with 248,320 config rows, and its small text LMs
(Qwen3.5-0.8B's LM, ``Qwen3_5ForCausalLM``) have the same 248,320 rows. Scaled down: the Qwen-VL fixtures'
120-token tokenizer (specials from 100) and 128 rows for the target and its natural text draft. Registered
only where transformers has Qwen3.5.

Qwen3.5-MoE (``qwen3_5_moe``): the same decoder with sparse MoE MLPs (4 experts, 2 per token, a gated shared
expert; 256 experts, 8 per token in transformers' defaults), built by the same class under the MoE classes' names.
"""

from __future__ import annotations

import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel, ProcessorMixin

from .qwen_vl import (EOS_ID, IMAGE_ID, PAD_ID, VIDEO_ID, VISION_END_ID, VISION_START_ID, QwenVLFixtures,
                      make_inputs, reserved_ids)
from .registry import register_fixture
from .shaping import INIT_RANGE, finish, shape_lm

VOCAB = 128  # target and natural text draft rows (248,320 upstream)
HIDDEN = 64
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
EOS_OFFSET = 2.0  # as the Qwen-VL fixtures: eos_bias=2 stops most rows early
#: the MoE text config's MLP fields (replacing ``intermediate_size``)
MOE_FIELDS = dict(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2)


def text_fields(vocab: int = VOCAB) -> dict:
    """The tiny hybrid text config's fields (Qwen3.5-9B's shape scaled down)."""
    return dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=len(LAYER_TYPES),
                layer_types=list(LAYER_TYPES), num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_conv_kernel_dim=4, attention_bias=True, max_position_embeddings=1024,
                initializer_range=INIT_RANGE, bos_token_id=None, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})


def config(prefix: str = "Qwen3_5") -> PretrainedConfig:
    """The tiny target config; ``prefix`` "Qwen3_5Moe": Qwen3.5-MoE's (MoE MLPs, :data:`MOE_FIELDS`)."""
    text = text_fields()
    if prefix == "Qwen3_5Moe":
        text = {**{k: v for k, v in text.items() if k != "intermediate_size"}, **MOE_FIELDS}
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=HIDDEN, num_position_embeddings=64)
    return getattr(transformers, f"{prefix}Config")(text_config=text, vision_config=vision, image_token_id=IMAGE_ID,
                                      video_token_id=VIDEO_ID, vision_start_token_id=VISION_START_ID,
                                      vision_end_token_id=VISION_END_ID, tie_word_embeddings=False)


class Qwen3_5Fixtures(QwenVLFixtures):
    """Qwen3.5: the Qwen3-VL processor (as upstream) and token layout, a hybrid decoder; ``prefix`` names the
    transformers classes (``Qwen3_5Moe``: Qwen3.5-MoE's)."""

    group = "qwen3_5"
    shared_suites = False  # the reference Gated DeltaNet kernels make every forward ~2x Qwen3-VL's: own suite

    def __init__(self, name: str = "qwen3_5", prefix: str = "Qwen3_5", eos_offset: float = EOS_OFFSET) -> None:
        super().__init__(name)
        self.prefix, self.eos_offset = prefix, eos_offset

    def target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
        model = getattr(transformers, f"{self.prefix}ForConditionalGeneration")._from_config(
            config(self.prefix), attn_implementation="sdpa")
        with torch.no_grad():  # image features carry nothing in the LM's bias channel (see shaping.shape_lm)
            last = [m for m in model.model.visual.merger.modules() if isinstance(m, torch.nn.Linear)][-1]
            last.weight[0] = 0.0
            last.bias[0] = 0.0
        gen = torch.Generator().manual_seed(seed + 1000)
        shape_lm(model.model.language_model, model.lm_head, VOCAB, reserved_ids(VOCAB),
                 None if eos_bias is None else eos_bias + self.eos_offset, gen, eos_id=EOS_ID)
        if eos_bias is not None:  # EOS's logit is the bias alone, as the Qwen-VL fixtures'
            with torch.no_grad():
                keep = model.lm_head.weight[EOS_ID, 0].clone()
                model.lm_head.weight[EOS_ID] = 0.0
                model.lm_head.weight[EOS_ID, 0] = keep
        return finish(model, PAD_ID, EOS_ID, bos_id=None)

    def processor(self, vocab_size: int) -> ProcessorMixin:
        return QwenVLFixtures("qwen3_vl").processor(vocab_size)  # upstream Qwen3.5 ships Qwen3VLProcessor

    def natural_draft_vocab(self, target: PreTrainedModel) -> int:
        return VOCAB

    def causal_lm_config(self, target: PreTrainedModel) -> PretrainedConfig:
        fields = {**target.config.text_config.to_dict(), "tie_word_embeddings": False}
        return getattr(transformers, f"{self.prefix}TextConfig")(**fields)

    def random_draft(self, target: PreTrainedModel, seed: int, vocab_size: int | None,
                     eos_bias: float | None) -> PreTrainedModel:
        """A different random 1-linear + 1-full-attention layer Qwen3.5 text LM (hidden 64)."""
        fields = {**text_fields(vocab_size or VOCAB), "num_hidden_layers": 2,
                  "layer_types": ["linear_attention", "full_attention"]}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            draft = transformers.Qwen3_5ForCausalLM._from_config(transformers.Qwen3_5TextConfig(**fields),
                                                                  attn_implementation="sdpa")
            gen = torch.Generator().manual_seed(seed + 1000)
            shape_lm(draft.model, draft.lm_head, fields["vocab_size"], reserved_ids(fields["vocab_size"]), eos_bias,
                     gen, eos_id=EOS_ID)
        return finish(draft, PAD_ID, EOS_ID, bos_id=None)

    def inputs(self, processor: ProcessorMixin, prompts: list[str], images: list, videos: list | None,
               padding_side: str):
        return make_inputs("qwen3_vl", processor, prompts, images, videos, padding_side)


if hasattr(transformers, "Qwen3_5ForConditionalGeneration"):  # registered where transformers has it
    register_fixture(Qwen3_5Fixtures())
if hasattr(transformers, "Qwen3_5MoeForConditionalGeneration"):
    # EOS offset measured as the Qwen3-VL-MoE fixture's: with 2.0 every row stops at the first step
    register_fixture(Qwen3_5Fixtures("qwen3_5_moe", "Qwen3_5Moe", eos_offset=0.5))
