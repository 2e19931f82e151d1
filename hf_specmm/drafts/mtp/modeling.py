"""``MtpDraft``: a target checkpoint's own multi-token-prediction (MTP) layer as a draft.

Qwen3.5 (vLLM's ``qwen3_5_mtp.py`` layout: ``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``,
``mtp.layers.0``, ``mtp.norm``) and transformers' ``MtpLayer`` (``eh_proj``, ``enorm``, ``hnorm``, ``mtp_block``,
``post_norm`` / ``shared_head.norm``) are the same step under two sets of names::

    g_{t+1} = norm(layer(fc([norm_e(emb(x_{t+1})); norm_h(f_t)])))      logits_{t+1} = lm_head(g_{t+1})

f_t is the target's last hidden state after its final norm (what its LM head reads); while drafting, the
normed output g is fed back as the next f. That is an EAGLE-1 feature head (:class:`FeatureHeadDraft`) with
the two input norms and an ``fc`` without bias, so the MTP draft is one: the same drafter, caches, batches,
trees, static caches and ``Auto``. The layer is the target family's decoder layer of full attention (a hybrid
target's MTP layer is one, as vLLM builds it), inside the family's text model (its rotary embedding and masks).
The target's embedding and LM head are used, never stored or copied.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from ..feature_head.configuration import FeatureHeadDraftConfig
from ..feature_head.modeling import FeatureHeadDraft, family_body, head_config_fields


class MtpDraftConfig(FeatureHeadDraftConfig):
    """An MTP layer on a target's last hidden states.

    Args:
        hidden_first: the fused input is ``[norm_h(f); norm_e(emb)]`` (Inkling's order, transformers'
            ``mtp_hidden_states_first``) instead of ``[norm_e(emb); norm_h(f)]``.
        source: where the layer came from (the target checkpoint it was read from, or None: trained here).
        layout: the checkpoint layout it was read from ("vllm": ``mtp.*``; "transformers": ``layers.{N}.eh_proj``).
        (the other fields: :class:`FeatureHeadDraftConfig`'s)
    """

    model_type = "hf_specmm_mtp"

    def __init__(self, hidden_first: bool = False, source: str | None = None, layout: str | None = None,
                 **kwargs: Any):
        self.hidden_first = bool(hidden_first)
        self.source = source
        self.layout = layout
        super().__init__(**kwargs)


class MtpDraft(FeatureHeadDraft):
    """A target's MTP layer (one step per draft token, its normed output fed back). Pass it as ``assistant_model``
    after ``hf_specmm.enable``; read it from the target's own checkpoint with
    ``hf_specmm.load_draft(<target folder or Hub id>, kind="mtp", target=model)``, or make a fresh one to train
    with :meth:`for_target`."""

    variant = "mtp"
    config_class = MtpDraftConfig
    save_formats = ("hf_specmm", "speculators")
    slot_lag = 1  #: its drafter puts a slot at its feature's position, one before its token's (see drafter.py)

    def build_modules(self, config: MtpDraftConfig) -> None:
        text = config.text_config
        hidden = text.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.body = family_body(text)
        norm = type(self.body.norm)  # the family's RMSNorm (Qwen3.5's is 1 + w, zero-initialised)
        self.pre_fc_norm_embedding = norm(hidden, eps=text.rms_norm_eps)
        self.pre_fc_norm_hidden = norm(hidden, eps=text.rms_norm_eps)

    def fuse_step(self, inputs_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """``fc([norm_e(embedding); norm_h(feature)])`` (the other order with ``hidden_first``)."""
        dtype = self.fc.weight.dtype
        embeds = self.pre_fc_norm_embedding(inputs_embeds.to(dtype))
        hidden = self.pre_fc_norm_hidden(features.to(device=inputs_embeds.device, dtype=dtype))
        return self.fc(torch.cat([hidden, embeds] if self.config.hidden_first else [embeds, hidden], -1))

    def save_pretrained(self, save_directory: Any, *args: Any, format: str = "hf_specmm", **kwargs: Any) -> None:
        """``format="hf_specmm"`` (default: config, safetensors, model card) or ``"speculators"`` (speculators'
        ``mtp`` layout, :mod:`.speculators`: what vLLM's ``--speculative-config '{"method": "mtp", ...}'`` and
        speculators' ``MTPDraftModel`` read)."""
        self.check_save_format(format)
        if format == "hf_specmm":
            return super().save_pretrained(save_directory, *args, **kwargs)
        if args or kwargs:
            raise ValueError(f"save_pretrained(format={format!r}) writes config.json and model.safetensors only; it "
                             f"takes no {', '.join(sorted(kwargs)) or 'positional arguments'}")
        from .speculators import export_mtp

        export_mtp(self, save_directory)

    @classmethod
    def for_target(cls, target: PreTrainedModel, num_layers: int = 1, target_name: str | None = None,
                   hidden_first: bool = False, source: str | None = None, layout: str | None = None,
                   **unused: Any) -> "MtpDraft":
        """A randomly initialised MTP layer sized for ``target`` (its text family's full-attention decoder layer),
        attached to it. ``num_layers``: 1 (one layer reused at every step)."""
        if num_layers != 1 or unused:
            raise ValueError(f"an MTP draft has one layer, reused at every step (num_layers={num_layers!r}"
                             f"{'; ' + ', '.join(sorted(unused)) if unused else ''}): multi-layer MTP checkpoints "
                             "are not read by hf_specmm")
        fields = head_config_fields(target, 1, target_name, kind="mtp")
        if isinstance(fields["text_config"].get("layer_types"), list):  # a hybrid's MTP layer is full attention
            fields["text_config"]["layer_types"] = ["full_attention"]
        config = MtpDraftConfig(hidden_first=hidden_first, source=source, layout=layout, **fields)
        return cls(config).to_target_device(target)
