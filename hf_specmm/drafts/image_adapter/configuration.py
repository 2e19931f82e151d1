"""Configuration of :class:`ImageAdapterDraft`."""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, PretrainedConfig


class ImageAdapterDraftConfig(PretrainedConfig):
    """A small causal LM (``text_config``) plus an adapter from the target's image embeddings.

    Args:
        text_config: config of the draft's language model (any ``AutoModelForCausalLM`` config).
        image_feature_dim: width of the target's image embeddings the adapter reads (the target's text
            hidden size: the adapter reads what the target's own projector produced).
        image_token_id / video_token_id: the target's placeholder ids; the draft's prompt keeps them
            as the positions where adapted image features go.
        image_pool: average-pool every ``image_pool`` consecutive visual tokens into one (1 = keep all).
        target: the target this draft was made for (Hub id or class name), written into the model card.
    """

    model_type = "hf_specmm_image_adapter_draft"
    sub_configs = {"text_config": AutoConfig}

    def __init__(
        self,
        text_config: dict | PretrainedConfig | None = None,
        image_feature_dim: int = 64,
        image_token_id: int = 0,
        video_token_id: int | None = None,
        image_pool: int = 1,
        target: str | None = None,
        target_class: str | None = None,
        **kwargs: Any,
    ):
        if isinstance(text_config, dict):
            text_config = AutoConfig.for_model(**text_config)
        elif text_config is None:
            text_config = AutoConfig.for_model("llama")
        self.text_config = text_config
        self.image_feature_dim = image_feature_dim
        self.image_token_id = image_token_id
        self.video_token_id = video_token_id
        if isinstance(image_pool, bool) or not isinstance(image_pool, int) or image_pool < 1:
            raise ValueError(f"image_pool must be an integer >= 1, got {image_pool!r}")
        self.image_pool = image_pool
        self.target = target
        self.target_class = target_class
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    @property
    def placeholder_ids(self) -> tuple[int, ...]:
        return tuple(i for i in (self.image_token_id, self.video_token_id) if i is not None)

    def get_text_config(self, *args: Any, **kwargs: Any) -> PretrainedConfig:
        return self.text_config
