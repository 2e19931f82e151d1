"""``Eagle3HeadConfig``: the EAGLE-3 head's config (its Llama decoder layers, the fused target layers, the draft
vocabulary and ``speculators``' norm options). Apart from the head's module (:mod:`.eagle3`) so that the export to
the serving engines' layouts (:mod:`.export`), which knows the head only through its config and state dict, imports
the config and not the head."""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, LlamaConfig, PretrainedConfig

from .configuration import FeatureHeadDraftConfig


def rope_parameters(text: PretrainedConfig) -> dict[str, Any] | None:
    """The target's full-attention RoPE parameters (Gemma 3 keeps one set per layer type)."""
    rope = getattr(text, "rope_parameters", None)
    if isinstance(rope, dict) and "full_attention" in rope:
        rope = rope["full_attention"]
    return dict(rope) if isinstance(rope, dict) else None


def layer_config_for(text: PretrainedConfig, num_layers: int, vocab_size: int) -> LlamaConfig:
    """The Llama decoder-layer config of a head on a target with text config ``text``: its width, heads,
    head size, MLP width, norm epsilon and RoPE; SiLU MLP, no biases (EAGLE-3's layer). A target with per-layer
    shapes (Gemma 4) gives those of its full-attention layers, whose RoPE the head takes."""
    per_layer = getattr(text, "per_layer_config", None)
    if per_layer is not None and "full_attention" in (getattr(text, "layer_types", None) or ()):
        text = per_layer["full_attention"]  # the target's config resolved for that layer type
    heads = int(text.num_attention_heads)
    # a target with MoE MLPs only (Qwen3.5-MoE) has no dense width: that of a token's routed experts together
    width = getattr(text, "intermediate_size", None) or text.moe_intermediate_size * text.num_experts_per_tok
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=text.hidden_size, intermediate_size=width,
        num_hidden_layers=num_layers, num_attention_heads=heads,
        num_key_value_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads), hidden_act="silu",
        max_position_embeddings=int(getattr(text, "max_position_embeddings", 4096)),
        rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
        # M-RoPE's sections are the text family's business (the body's rotary embedding); exports add them back
        rope_parameters={k: v for k, v in (rope_parameters(text) or {"rope_type": "default", "rope_theta": 10000.0}).items()
                         if not k.startswith("mrope") and k != "partial_rotary_factor"},
        attention_bias=False, mlp_bias=False, tie_word_embeddings=False)


class Eagle3HeadConfig(FeatureHeadDraftConfig):
    """:class:`FeatureHeadDraftConfig` plus EAGLE-3's fields.

    Args:
        layer_config: the Llama config of the head's decoder layers (``transformer_layer_config`` in a
            ``speculators`` checkpoint); its ``vocab_size`` is the target's.
        aux_layers: the target decoder layers whose inputs are fused (``eagle_aux_hidden_state_layer_ids``).
        draft_vocab_size: rows of the head's LM head.
        norm_before_residual: the first layer's residual is the normed feature (else the raw one).
        norm_before_fc: one RMSNorm (``input_norm``, k·H wide) over the concatenated target features before ``fc``.
        fc_norm: an RMSNorm per target layer (``fc_norm.<i>``, H wide) before the concatenation (not with
            ``norm_before_fc``).
        norm_output: the head's output is normed (``norm``) before it is fed back and read by the LM head.
        target_num_layers: decoder layers of the target it was made for (checked when attached).
    """

    model_type = "hf_specmm_eagle3_head"
    sub_configs = {"text_config": AutoConfig, "layer_config": AutoConfig}

    def __init__(self, layer_config: dict | PretrainedConfig | None = None, aux_layers: list[int] | None = None,
                 draft_vocab_size: int | None = None, norm_before_residual: bool = False,
                 target_num_layers: int | None = None, norm_before_fc: bool = False, fc_norm: bool = False,
                 norm_output: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        if norm_before_fc and fc_norm:  # speculators refuses the pair too: one norm over all, or one per layer
            raise ValueError("norm_before_fc and fc_norm are exclusive: one RMSNorm over the fused features, or one "
                             "per target layer")
        if isinstance(layer_config, dict):
            layer_config = LlamaConfig(**{k: v for k, v in layer_config.items() if k != "model_type"})
        elif layer_config is None:
            layer_config = layer_config_for(self.text_config, self.num_layers, self.text_config.vocab_size)
        self.layer_config = layer_config
        self.aux_layers = list(aux_layers) if aux_layers is not None else None  # None: a bare config, no head
        self.draft_vocab_size = int(draft_vocab_size or layer_config.vocab_size)
        self.norm_before_residual = bool(norm_before_residual)
        self.norm_before_fc, self.fc_norm, self.norm_output = bool(norm_before_fc), bool(fc_norm), bool(norm_output)
        self.target_num_layers = target_num_layers
