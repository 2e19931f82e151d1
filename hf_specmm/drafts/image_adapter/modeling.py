"""``ImageAdapterDraft``: a small causal LM that also reads the target's image embeddings.

2404.08856's second draft kind is a small LLaVA. Here the draft never runs a vision tower: the
target's own image embeddings (what its projector produced, captured during the target's prefill)
go through a small adapter into the draft's embedding space, at the image positions of the draft's
prompt. Visual tokens can be average-pooled (``image_pool``) to shorten the draft's prompt.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, GenerationMixin, PreTrainedModel

from ..checkpoints import DraftCheckpointMixin
from ...errors import IncompatibleDraftError
from ...targets import target_spec
from .configuration import ImageAdapterDraftConfig


def pool_image_features(features: torch.Tensor, run_lengths: list[int], pool: int) -> torch.Tensor:
    """Average-pool each run of consecutive visual tokens in chunks of ``pool`` (last chunk may be short).

    ``features`` [sum(run_lengths), D] -> [sum(ceil(n / pool)), D].
    """
    if pool == 1:
        return features
    chunks = []
    for run in torch.split(features, run_lengths):
        chunks.extend(piece.mean(0, keepdim=True) for piece in torch.split(run, pool))
    return torch.cat(chunks) if chunks else features[:0]


class ImageAdapter(nn.Module):
    """``x W_in`` plus a zero-initialised residual MLP: starts as a linear map (the identity when
    copying), trains into a non-linear one."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.proj_in = nn.Linear(in_dim, out_dim)
        self.mlp = nn.Sequential(nn.Linear(out_dim, out_dim), nn.GELU(), nn.Linear(out_dim, out_dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = self.proj_in(features)
        return hidden + self.mlp(hidden)

    @torch.no_grad()
    def make_identity(self) -> None:
        if self.proj_in.in_features != self.proj_in.out_features:
            raise ValueError("an identity adapter needs equal input and output widths")
        nn.init.eye_(self.proj_in.weight)
        nn.init.zeros_(self.proj_in.bias)
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)


class ImageAdapterDraft(DraftCheckpointMixin, PreTrainedModel, GenerationMixin):
    """Draft LM + image adapter. Use it as ``assistant_model`` exactly like a text-only draft.

    Example::

        >>> import hf_specmm
        >>> from hf_specmm import testing
        >>> target = testing.tiny_target("llava")
        >>> draft = hf_specmm.ImageAdapterDraft.for_target(target, testing.random_text_draft(target))
        >>> hf_specmm.enable(target)  # doctest: +ELLIPSIS
        Llava...
    """

    config_class = ImageAdapterDraftConfig
    base_model_prefix = "draft"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules: list[str] = []

    def __init__(self, config: ImageAdapterDraftConfig, language_model: PreTrainedModel | None = None):
        super().__init__(config)
        if language_model is None:
            language_model = AutoModelForCausalLM.from_config(config.text_config)
        self.language_model = language_model
        self.adapter = ImageAdapter(config.image_feature_dim, config.text_config.hidden_size)
        self.post_init()

    # ---- delegation to the language model --------------------------------------------------------
    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.language_model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module:
        return self.language_model.get_output_embeddings()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, ImageAdapter):  # the LM's own weights are initialised by the LM
            nn.init.normal_(module.proj_in.weight, std=module.proj_in.in_features ** -0.5)
            nn.init.zeros_(module.proj_in.bias)
            nn.init.zeros_(module.mlp[2].weight)
            nn.init.zeros_(module.mlp[2].bias)

    def embed(self, input_ids: torch.Tensor, image_features: torch.Tensor | None) -> torch.Tensor:
        """Token embeddings with adapted ``image_features`` [N, D] at the N placeholder positions."""
        placeholders = torch.isin(input_ids, torch.tensor(self.config.placeholder_ids, device=input_ids.device))
        embeds = self.get_input_embeddings()(input_ids.masked_fill(placeholders, 0))
        count = int(placeholders.sum())
        if image_features is None:
            if count:
                raise ValueError(f"input_ids hold {count} image placeholders but no image_features were given")
            return embeds
        if image_features.shape[0] != count:
            raise ValueError(f"{image_features.shape[0]} image feature rows for {count} image placeholders")
        adapted = self.adapter(image_features.to(device=embeds.device, dtype=self.adapter.proj_in.weight.dtype))
        return embeds.masked_scatter(placeholders[..., None], adapted.to(embeds.dtype))

    def forward(self, input_ids: torch.Tensor | None = None, image_features: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, logits_to_keep: int | torch.Tensor = 0,
                **kwargs: Any) -> Any:
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids, image_features)
            kwargs.update(self.per_layer_inputs(input_ids))
        return self.language_model(inputs_embeds=inputs_embeds, logits_to_keep=logits_to_keep, **kwargs)

    def per_layer_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """A language model with per-layer input embeddings (Gemma 4 text LMs) looks them up from token ids,
        which ``inputs_embeds`` do not carry: they are looked up here, image slots read as the pad id, as the
        Gemma 4 targets do. Empty for other LMs."""
        decoder = self.language_model.get_decoder()
        if not getattr(decoder.config, "hidden_size_per_layer_input", None) or \
                not hasattr(decoder, "get_per_layer_inputs"):
            return {}
        placeholders = torch.isin(input_ids, torch.tensor(self.config.placeholder_ids, device=input_ids.device))
        pad = decoder.config.pad_token_id or 0
        return {"per_layer_inputs": decoder.get_per_layer_inputs(input_ids.masked_fill(placeholders, pad))}

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def for_target(cls, target: PreTrainedModel, language_model: PreTrainedModel, copy_projector: bool = False,
                   image_pool: int = 1, target_name: str | None = None) -> "ImageAdapterDraft":
        """A draft sized for ``target`` around ``language_model`` (any causal LM sharing its text ids).

        ``copy_projector=True`` makes the adapter reproduce the target's projector output exactly (it
        reads that output, so this is the identity map); it needs the draft's hidden size to equal the
        target's. With a copy of the target's LM this gives a draft that sees what the target sees.
        """
        spec = target_spec(target)
        text_config = target.config.get_text_config()
        ids = sorted(spec.placeholder_ids)
        config = ImageAdapterDraftConfig(
            text_config=copy.deepcopy(language_model.config).to_dict(),
            image_feature_dim=text_config.hidden_size,
            image_token_id=ids[0],
            video_token_id=ids[1] if len(ids) > 1 else None,
            image_pool=image_pool,
            target=target_name or getattr(target.config, "_name_or_path", None) or None,
            target_class=type(target).__name__,
        )
        param = next(language_model.parameters())
        draft = cls(config, language_model=language_model).to(device=param.device, dtype=param.dtype)
        if copy_projector:
            if language_model.config.hidden_size != text_config.hidden_size:
                raise IncompatibleDraftError(
                    f"copy_projector needs the draft's hidden size ({language_model.config.hidden_size}) to equal "
                    f"the target's ({text_config.hidden_size}); use copy_projector=False and train the adapter.")
            draft.adapter.make_identity()
        draft.generation_config = copy.deepcopy(language_model.generation_config)
        return draft.eval()
