"""Configuration of :class:`FeatureHeadDraft`."""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, PretrainedConfig


class FeatureHeadDraftConfig(PretrainedConfig):
    """An EAGLE-1 style head on a target's last hidden states.

    Args:
        text_config: the target's text (LM) config with ``num_hidden_layers`` set to the head's layer count;
            the head's decoder layers are that LM's own class (``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ...).
        target / target_class: the target this head was made for (Hub id or folder name; class name).
        target_fingerprint: ``{"embed": {"shape", "values"}, "lm_head": {...}}``: shapes and sampled values of
            the target's input embedding and LM head, which the head uses (never stores); a target whose
            weights differ is refused (:func:`fingerprint_matches`).
    """

    model_type = "hf_specmm_feature_head"
    sub_configs = {"text_config": AutoConfig}

    def __init__(self, text_config: dict | PretrainedConfig | None = None, target: str | None = None,
                 target_class: str | None = None, target_fingerprint: dict | None = None, **kwargs: Any):
        if isinstance(text_config, dict):
            text_config = AutoConfig.for_model(**text_config)
        elif text_config is None:
            text_config = AutoConfig.for_model("llama", num_hidden_layers=1)
        self.text_config = text_config
        self.target = target
        self.target_class = target_class
        self.target_fingerprint = target_fingerprint
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    @property
    def num_layers(self) -> int:
        return int(self.text_config.num_hidden_layers)

    def get_text_config(self, *args: Any, **kwargs: Any) -> PretrainedConfig:
        return self.text_config


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's choice, (2, L // 2, L - 3), for a target of ``num_layers`` = L decoder layers (L >= 8; a
    shallower target gets three distinct indices spread over 0..L). Index k is the input of decoder layer k
    (the output of layer k - 1; 0 = the embeddings, L = the last layer's output before the final norm), as
    vLLM and ``speculators`` count them."""
    if num_layers >= 8:
        return [2, num_layers // 2, num_layers - 3]
    return sorted({round(i * num_layers / 2) for i in range(3)})
