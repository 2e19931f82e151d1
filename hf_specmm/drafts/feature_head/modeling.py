"""``FeatureHeadDraft``: an EAGLE-1 style draft head on the target's own last hidden states.

Each step fuses a feature f_t (the target's last hidden state at position t, or the head's own
prediction while drafting) with the embedding of the next token x_{t+1}::

    g_{t+1} = norm(layers(fc([emb(x_{t+1}); f_t])))      logits_{t+1} = lm_head(g_{t+1})  ->  x_{t+2}

The feature is what the target's LM head reads: the output of its text decoder, **after** the final norm
(EAGLE-1 reads ``base_model.model(...)[0]``, which is post-norm). So the head's prediction g goes
straight into the target's LM head; the target's final norm is not applied again (the head ends in its
own norm, a copy of that norm's class, because its output should live where the normed features live).

The layers are the target's own text decoder (``AutoModel`` of the target's text config with
``num_hidden_layers`` = the head's layers: the family's decoder-layer class, rotary embedding and mask
code, no copies) without its token embedding, and without what only the target's full stack can run
(:data:`TARGET_ONLY_FEATURES`: Gemma 4's per-layer inputs and KV sharing). The target's embedding and LM
head are **used, not stored**: :meth:`FeatureHeadDraft.attach` references them, and a fingerprint of
those weights in the config ties the head to its target (checked before any work).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from torch import nn
from transformers import AutoModel, PreTrainedModel
from transformers.utils import ModelOutput

from ... import _compat
from ...targets import family_of
from ..checkpoints import DraftCheckpointMixin
from ...errors import IncompatibleDraftError
from .configuration import FeatureHeadDraftConfig

_SAMPLES = 64  # values sampled per fingerprinted weight
# features of a target's text config that only its own full stack can run, switched off in a head's layers:
# Gemma 4's per-layer input embeddings (a table of the target's depth, looked up from token ids the head does
# not read) and KV sharing (late layers reusing K/V of earlier layers the head does not have)
TARGET_ONLY_FEATURES = {"hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0}


def weight_fingerprint(weight: torch.Tensor) -> dict[str, Any]:
    """Shape and ``_SAMPLES`` evenly spaced values of ``weight`` (cheap for a 7B target: one gather)."""
    flat = weight.detach().reshape(-1)
    idx = (torch.arange(_SAMPLES) * (flat.numel() - 1)) // (_SAMPLES - 1)  # int64, the same on every device
    values = flat[idx.to(flat.device)].float().cpu().tolist()
    return {"shape": list(weight.shape), "values": [float(f"{v:.6g}") for v in values]}


def target_fingerprint(target: PreTrainedModel) -> dict[str, Any]:
    """Fingerprint of the two target weights a head uses: its input embedding and its LM head."""
    return {"embed": weight_fingerprint(target.get_input_embeddings().weight),
            "lm_head": weight_fingerprint(target.get_output_embeddings().weight)}


def fingerprint_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """None when ``current`` matches ``saved`` (values within bf16 rounding), else what differs."""
    for name in ("embed", "lm_head"):
        a, b = saved[name], current[name]
        if list(a["shape"]) != list(b["shape"]):
            return f"{name} shape {list(b['shape'])} (the head was made for {list(a['shape'])})"
        if not torch.allclose(torch.tensor(a["values"]), torch.tensor(b["values"]), rtol=1e-2, atol=1e-5):
            return f"{name} weights (sampled values differ: another target, or a fine-tuned one)"
    return None


def family_body(text: Any) -> nn.Module:
    """The decoder stack of ``text``'s family (its layers, rotary embedding, masks and position rule) without
    its token table (1 row at build time, then dropped)."""
    body_config = copy.deepcopy(text)
    body_config.vocab_size, body_config.pad_token_id = 1, 0  # 0: the one row (strict configs take no None)
    body_config._attn_implementation = text._attn_implementation
    try:
        body = AutoModel.from_config(body_config)
    except ValueError:  # a text config no AutoModel maps (Step3.7's): its ``<Name>Model`` by transformers' naming
        model_class = getattr(transformers, type(text).__name__.removesuffix("Config") + "Model", None)
        if model_class is None:
            raise
        body = model_class._from_config(body_config)
    body.set_input_embeddings(None)
    return body


class _TargetRef(dict):
    """The target's embedding and LM head as the head references them: a plain dict (never registered as
    submodules, so never saved or moved with the head) that ``copy.deepcopy(head)`` shares, not copies."""

    def __deepcopy__(self, memo: dict) -> "_TargetRef":
        return _TargetRef(self)


@dataclass
class FeatureHeadOutput(ModelOutput):
    """``hidden_states`` [B, k, H]: the predicted features g; ``logits`` [B, k', V] when asked
    (``logits_to_keep``), through the attached target's LM head."""

    hidden_states: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    cache: Any = None  # the head's KV cache (``past_key_values`` before transformers 5.24)


class FeatureHeadDraft(DraftCheckpointMixin, PreTrainedModel):
    """EAGLE-1 style draft head tied to one target. Pass it as ``assistant_model`` after ``hf_specmm.enable``.

    Example::

        >>> import hf_specmm
        >>> from hf_specmm import testing
        >>> target = testing.tiny_target("llava")
        >>> head = hf_specmm.FeatureHeadDraft.for_target(target)
        >>> hf_specmm.enable(target)  # doctest: +ELLIPSIS
        Llava...
        >>> inputs = testing.make_inputs("llava", testing.tiny_processor("llava"), ["hi"], [testing.tiny_image(0)])
        >>> out = target.generate(**inputs, assistant_model=head, max_new_tokens=8)
    """

    variant = "eagle1"  #: ``for_target(variant=...)``: which head this class builds

    config_class = FeatureHeadDraftConfig
    base_model_prefix = "head"
    main_input_name = "features"
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules: list[str] = []

    def __init__(self, config: FeatureHeadDraftConfig):
        super().__init__(config)
        self._target = _TargetRef()  # the target's modules: referenced, never registered or saved
        self.build_modules(config)
        self.post_init()

    def build_modules(self, config: FeatureHeadDraftConfig) -> None:
        """EAGLE-1: ``fc`` over [embedding; feature], then the target family's decoder layers and final norm."""
        hidden = config.text_config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.body = family_body(config.text_config)

    # ---- the target's embedding and LM head (used, not stored) -------------------------------------
    def check_target(self, target: PreTrainedModel) -> None:
        """Raise :class:`IncompatibleDraftError` unless ``target`` is the model this head was made for."""
        made_for = self.config.target or self.config.target_class or "another target"
        saved = self.config.target_fingerprint
        if saved is None:
            raise IncompatibleDraftError("This FeatureHeadDraft records no target fingerprint; build it with "
                                         "FeatureHeadDraft.for_target(target).")
        if target.get_input_embeddings() is None or target.get_output_embeddings() is None:
            raise IncompatibleDraftError(f"{type(target).__name__} has no input embedding / LM head for a feature head")
        problem = fingerprint_mismatch(saved, target_fingerprint(target))
        if problem is not None:
            raise IncompatibleDraftError(
                f"This FeatureHeadDraft was made for {made_for} (its target_fingerprint); the target's {problem}. A "
                "feature head reads the "
                "target's hidden states and uses its embedding and LM head, so it only drafts for that target: "
                "use a head made for this target (FeatureHeadDraft.for_target(target), then train it).")

    def get_input_embeddings(self) -> None:
        """None: the head owns no embedding table (it uses its target's, referenced by :meth:`attach`, never
        saved or tied into the head's files)."""
        return None

    def get_output_embeddings(self) -> None:
        """None: the logits come from the target's LM head (see :meth:`lm_logits`)."""
        return None

    def attach(self, target: PreTrainedModel, check: bool = True) -> "FeatureHeadDraft":
        """Reference ``target``'s embedding and LM head (checked against the fingerprint unless ``check=False``)."""
        if check:
            self.check_target(target)
        self._target = _TargetRef(embed=target.get_input_embeddings(), lm_head=target.get_output_embeddings())
        return self

    @property
    def attached(self) -> bool:
        return bool(self._target)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The target's token embeddings of ``input_ids``, in the head's dtype and device."""
        table = self._attached("embed")
        return table(input_ids.to(table.weight.device)).to(device=self.fc.weight.device, dtype=self.fc.weight.dtype)

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of predicted features through the target's LM head (no final norm: features are post-norm)."""
        head = self._attached("lm_head")
        return head(hidden.to(device=head.weight.device, dtype=head.weight.dtype))

    def _attached(self, name: str) -> nn.Module:
        if not self._target:
            raise RuntimeError("FeatureHeadDraft is not attached to its target: call head.attach(target) (generate "
                               "with assistant_model=head does it)")
        return self._target[name]

    # ---- forward ---------------------------------------------------------------------------------
    def forward(self, features: torch.Tensor, inputs_embeds: torch.Tensor | None = None,
                input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool = False,
                logits_to_keep: int = 0, **kwargs: Any) -> FeatureHeadOutput:
        """``features`` [B, k, H] f_t, and the next tokens as ``inputs_embeds`` [B, k, H] (the target's own
        embeddings, image features included) or ``input_ids`` [B, k] -> predicted f_{t+1} [B, k, H]."""
        if cache is None:  # the name before transformers 5.24
            cache = kwargs.pop("past_key_values", None)
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids)
        fused = self.fuse_step(inputs_embeds, features)
        out = self.body(inputs_embeds=fused, attention_mask=attention_mask, position_ids=position_ids,
                        **_compat.cache_kwargs(cache), use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state
        logits = self.lm_logits(hidden[:, -logits_to_keep:]) if logits_to_keep else None
        return FeatureHeadOutput(hidden_states=hidden, logits=logits, cache=_compat.output_cache(out))

    def fuse_step(self, inputs_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """The layers' input at each slot: ``fc([embedding; feature])``."""
        dtype = self.fc.weight.dtype
        return self.fc(torch.cat([inputs_embeds.to(dtype), features.to(device=inputs_embeds.device, dtype=dtype)], -1))

    # ---- construction, saving, loading -----------------------------------------------------------
    @classmethod
    def for_target(cls, target: PreTrainedModel, num_layers: int = 1, target_name: str | None = None,
                   variant: str = "eagle1", aux_layers: list[int] | None = None,
                   draft_vocab_size: int | None = None) -> "FeatureHeadDraft":
        """A randomly initialised head sized for ``target`` (its text family's decoder layers, its width),
        attached to it. ``variant="eagle3"``: an :class:`~hf_specmm.drafts.feature_head.eagle3.Eagle3FeatureHead`
        reading ``aux_layers`` of the target (EAGLE-3's three by default) with a ``draft_vocab_size``-row LM head."""
        if variant not in ("eagle1", "eagle3"):
            raise ValueError(f"variant={variant!r}: choose 'eagle1' (the EAGLE-1 head on the last hidden state) or "
                             "'eagle3' (the EAGLE-3 head on three target layers)")
        if variant == "eagle3":  # the subclass (eagle3.py, imported with this package) sits above this module
            eagle3 = next(c for c in FeatureHeadDraft.__subclasses__() if c.variant == "eagle3")
            return eagle3.for_target(target, num_layers, target_name, aux_layers=aux_layers,
                                                draft_vocab_size=draft_vocab_size)
        if aux_layers is not None or draft_vocab_size is not None:
            raise ValueError(f"variant={variant!r}: an EAGLE-1 head (variant='eagle1') takes no aux_layers / "
                             "draft_vocab_size; variant='eagle3' does")
        config = FeatureHeadDraftConfig(**head_config_fields(target, num_layers, target_name))
        return cls(config).to_target_device(target)

    def to_target_device(self, target: PreTrainedModel) -> "FeatureHeadDraft":
        param = target.get_output_embeddings().weight
        return self.to(device=param.device, dtype=param.dtype).attach(target, check=False).eval()


#: per-layer lists that follow ``layer_types`` (Step3.7's MLP kinds and SwiGLU limits)
_LAST_LAYER_LISTS = ("mlp_layer_types", "swiglu_limits", "swiglu_limits_shared")


def head_config_fields(target: PreTrainedModel, num_layers: int, target_name: str | None,
                       kind: str = "feature_head") -> dict[str, Any]:
    """The config fields every feature head records: the target's text config with ``num_layers`` layers (the
    per-layer lists cut to that depth), what the target is, and the fingerprint of its embedding / LM head."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be an integer >= 1, got {num_layers!r}")
    family = family_of(target)
    why = dict(family.refused_draft_kinds).get(kind) if family is not None else None
    if why is not None:
        raise IncompatibleDraftError(f"no feature head can be made for a {type(target).__name__} target: {why}.")
    text = copy.deepcopy(target.config.get_text_config())
    text.num_hidden_layers = num_layers
    if _compat.stateful_layer_types(text):  # a hybrid (Qwen3.5): its last layers, so a 1-layer head is full attention
        text.layer_types = text.layer_types[-num_layers:]
    for name, off in TARGET_ONLY_FEATURES.items():
        if getattr(text, name, None):
            setattr(text, name, off)
    # per-layer lists sized for the target's depth (Muse Glimmer: layer_rope_theta; Step3.7: its MLP types, limits)
    for name in ("layer_types", "max_window_layers", "layer_rope_theta") + _LAST_LAYER_LISTS:
        if isinstance(getattr(text, name, None), list):
            setattr(text, name, getattr(text, name)[:num_layers])
    text_dict = text.to_dict()
    per_layer = text_dict.get("per_layer_config")
    if isinstance(per_layer, dict) and per_layer:
        # per-layer shapes (Gemma 4: full-attention layers with their own head size) must end on a full layer,
        # as the target does: the head's layers take the types and shapes of the target's LAST layers
        depth = len(target.config.get_text_config().layer_types)
        first = depth - num_layers
        text_dict["layer_types"] = list(target.config.get_text_config().layer_types)[first:]
        for name in _LAST_LAYER_LISTS:
            if isinstance(getattr(target.config.get_text_config(), name, None), list):
                text_dict[name] = list(getattr(target.config.get_text_config(), name))[first:]
        text_dict["per_layer_config"] = {str(int(i) - first): v for i, v in per_layer.items() if int(i) >= first}
    return dict(text_config=text_dict, target=target_name or getattr(target.config, "_name_or_path", None) or None,
                target_class=type(target).__name__, target_fingerprint=target_fingerprint(target))
