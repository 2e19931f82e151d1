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

Several MTP layers (``later_layers``, each with its own ``fc``, norms and one-layer body) chain as transformers'
``MtpModel`` runs them: layer k's slot reads layer k - 1's output at the slot before (``[norm_e(emb(x)); norm_h(
g^{k-1})]``), and draft step k proposes with layer k (past the last, the last again, its own output fed back).
Every layer writes every slot into its own cache layers, so all share one slot numbering and rollback.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from ... import _compat
from ..feature_head.configuration import FeatureHeadDraftConfig
from ..feature_head.modeling import FeatureHeadDraft, FeatureHeadOutput, family_body, head_config_fields

POST_NORMS = ("layer", "shared", "none")
#: per-layer lists of a text config, one entry per MTP layer in the draft's config (Step3.7's MLP kinds, limits)
_PER_LAYER = ("layer_types", "mlp_layer_types", "swiglu_limits", "swiglu_limits_shared", "layer_rope_theta",
              "max_window_layers")


def layer_config(text: Any, k: int) -> Any:
    """``text`` (the draft's config of all its MTP layers) cut to MTP layer ``k`` alone."""
    one = copy.deepcopy(text)
    layers = text.num_hidden_layers
    one.num_hidden_layers = 1
    for name in _PER_LAYER:
        value = getattr(text, name, None)
        if isinstance(value, list) and len(value) == layers:
            setattr(one, name, value[k:k + 1])
    return one


def build_layer(module: nn.Module, text: Any, k: int, post_norm: str = "layer") -> None:
    """Give ``module`` MTP layer ``k``'s parts: ``fc``, ``pre_fc_norm_embedding`` / ``pre_fc_norm_hidden`` and a
    one-layer family ``body`` (its decoder layer and output norm; none with ``post_norm="none"``). Layer k reads
    and writes cache layer ``layers - 1 - k``: the layers run in order and the text model reads the cache's length
    and mask sizes off cache layer 0, which must still hold the slots before the call until the last layer runs."""
    hidden = text.hidden_size
    module.fc = nn.Linear(2 * hidden, hidden, bias=False)
    module.body = family_body(layer_config(text, k))
    for part in module.body.layers[0].modules():
        if isinstance(getattr(part, "layer_idx", None), int):
            part.layer_idx = text.num_hidden_layers - 1 - k
    norm = type(module.body.norm)  # the family's RMSNorm (Qwen3.5's is 1 + w, zero-initialised)
    module.pre_fc_norm_embedding = norm(hidden, eps=text.rms_norm_eps)
    module.pre_fc_norm_hidden = norm(hidden, eps=text.rms_norm_eps)
    if post_norm == "none":  # transformers' MtpModel on a family with ``chain_hidden_post_norm`` unset (Inkling)
        module.body.norm = nn.Identity()


def fuse(module: nn.Module, hidden_first: bool, inputs_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``module.fc([norm_e(embedding); norm_h(feature)])`` (the other order with ``hidden_first``)."""
    dtype = module.fc.weight.dtype
    embeds = module.pre_fc_norm_embedding(inputs_embeds.to(dtype))
    hidden = module.pre_fc_norm_hidden(features.to(device=inputs_embeds.device, dtype=dtype))
    return module.fc(torch.cat([hidden, embeds] if hidden_first else [embeds, hidden], -1))


def slot_before(out: torch.Tensor, before: torch.Tensor, valid: torch.Tensor | None, chained: bool) -> torch.Tensor:
    """[B, k, H]: at each slot, a layer's output ``out`` at the slot before it: the block's previous slot where
    that is a real one, else ``before`` (the slot before the block; a row's first after its left holes). Not
    ``chained``: ``before`` [B, k, H] itself (each slot's own previous slot, outside the block)."""
    if not chained:
        return before
    previous = torch.cat([before, out[:, :-1]], 1)
    if valid is None:
        return previous
    real = torch.nn.functional.pad(valid, (1, 0), value=False)[:, :-1]
    return torch.where(real[..., None], previous, before)


def hide_first(mask: Any, k: int) -> Any:
    """``mask`` (the cache's 2-D slot mask, or a 4-D mask of full attention) without each row's first ``k`` real
    slots as keys: MTP layer k's first k slots read an output of layer k - 1 that no layer k - 1 slot made from
    real inputs (transformers' ``MtpModel`` starts layer k's sequence k tokens later)."""
    if mask is None or k == 0:  # the prompt's first slot is a hole: a mask always exists
        return mask
    if isinstance(mask, dict):  # per layer type (a static cache's): an MTP layer attends fully
        return {**mask, "full_attention": hide_first(mask.get("full_attention"), k)}
    if mask.dim() == 2:
        real = mask.bool()
    else:  # [B, 1, Q, KV]: what the first query reads (a full-attention draft: every real earlier slot)
        real = mask[:, :, :1] if mask.dtype == torch.bool else mask[:, :, :1] == 0
    first = real & (real.long().cumsum(-1) <= k)
    if mask.dtype == torch.bool:
        return mask & ~first
    return mask.masked_fill(first, 0 if mask.dim() == 2 else torch.finfo(mask.dtype).min)


@dataclass
class MtpOutput(FeatureHeadOutput):
    """:class:`FeatureHeadOutput` and ``layer_states`` [B, k, layers, H]: every MTP layer's output."""

    layer_states: torch.Tensor | None = None


class MtpLayerModules(nn.Module):
    """MTP layer k >= 1 of a multi-layer draft: the parts :func:`build_layer` gives it."""

    def __init__(self, text: Any, k: int, post_norm: str = "layer"):
        super().__init__()
        build_layer(self, text, k, post_norm)


class MtpDraftConfig(FeatureHeadDraftConfig):
    """An MTP layer on a target's last hidden states.

    Args:
        hidden_first: the fused input is ``[norm_h(f); norm_e(emb)]`` (Inkling's order, transformers'
            ``mtp_hidden_states_first``) instead of ``[norm_e(emb); norm_h(f)]``.
        source: where the layer came from (the target checkpoint it was read from, or None: trained here).
        layout: the checkpoint layout it was read from ("vllm": ``mtp.*``; "transformers": ``layers.{N}.eh_proj``;
            "inkling": ``model.mtp.layers.{k}.*``).
        post_norm: each layer's output norm: "layer" (its own), "shared" (one for every layer, Inkling's
            ``chain_norm``) or "none" (the layer's output as it is: transformers' ``MtpModel`` on a family whose
            config has ``chain_hidden_post_norm`` unset).
        raw_embeddings: tokens are embedded by the target's table without its own embedding norm (transformers'
            ``MtpModel`` drops Inkling's ``embed_norm``), image placeholders as the tokens they are.
        logits_divisor: the output is divided by it before the target's LM head (Inkling's
            ``logits_mup_width_multiplier``, as the target's own head reads its last hidden state).
        (the other fields: :class:`FeatureHeadDraftConfig`'s)
    """

    model_type = "hf_specmm_mtp"

    def __init__(self, hidden_first: bool = False, source: str | None = None, layout: str | None = None,
                 post_norm: str = "layer", raw_embeddings: bool = False, logits_divisor: float = 1.0,
                 **kwargs: Any):
        if post_norm not in POST_NORMS:
            raise ValueError(f"post_norm={post_norm!r}: choose one of {POST_NORMS}")
        self.hidden_first = bool(hidden_first)
        self.source = source
        self.layout = layout
        self.post_norm = post_norm
        self.raw_embeddings = bool(raw_embeddings)
        self.logits_divisor = float(logits_divisor)
        super().__init__(**kwargs)


class MtpDraft(FeatureHeadDraft):
    """A target's MTP layer(s) (one step per draft token, the normed output fed back). Pass it as ``assistant_model``
    after ``hf_specmm.enable``; read it from the target's own checkpoint with
    ``hf_specmm.load_draft(<target folder or Hub id>, kind="mtp", target=model)``, or make a fresh one to train
    with :meth:`for_target`."""

    variant = "mtp"
    config_class = MtpDraftConfig
    save_formats = ("hf_specmm", "speculators")
    slot_lag = 1  #: its drafter puts a slot at its feature's position, one before its token's (see drafter.py)

    def build_modules(self, config: MtpDraftConfig) -> None:
        build_layer(self, config.text_config, 0, config.post_norm)
        # layers 1.. of a multi-layer checkpoint, each with its own input norms, fc and output norm
        self.later_layers = nn.ModuleList(MtpLayerModules(config.text_config, k, config.post_norm)
                                          for k in range(1, config.text_config.num_hidden_layers))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The target's token embeddings of ``input_ids`` (with ``raw_embeddings``: its table's rows, unnormed)."""
        if not self.config.raw_embeddings:
            return super().embed(input_ids)
        table = self._attached("embed")
        rows = _compat.unnormed_embeddings(table, input_ids.to(table.weight.device))
        return rows.to(device=self.fc.weight.device, dtype=self.fc.weight.dtype)

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's LM head on ``hidden / logits_divisor``, cut to the text config's ``unpadded_vocab_size``."""
        logits = super().lm_logits(hidden / self.config.logits_divisor)
        rows = getattr(self.config.text_config, "unpadded_vocab_size", None)
        return logits[..., :rows] if isinstance(rows, int) and rows < logits.shape[-1] else logits

    def fuse_step(self, inputs_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """``fc([norm_e(embedding); norm_h(feature)])`` (the other order with ``hidden_first``)."""
        return fuse(self, self.config.hidden_first, inputs_embeds, features)

    @property
    def mtp_layers(self) -> list[nn.Module]:
        """The modules of MTP layer 0, 1, ... (each with ``fc``, the input norms and a one-layer ``body``)."""
        return [self, *self.later_layers]

    def forward(self, features: torch.Tensor, inputs_embeds: torch.Tensor | None = None,
                input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool = False,
                logits_to_keep: int = 0, step: int = 0, before: torch.Tensor | None = None,
                valid: torch.Tensor | None = None, chained: bool = True, **kwargs: Any) -> "MtpOutput":
        """:meth:`FeatureHeadDraft.forward` over k slots; with several MTP layers (the module docstring's chain):

        - ``step``: the draft step (0: the pending slots' read, then one per drafted token or tree level); the
          outputs are layer ``min(step, layers - 1)``'s, all layers' in ``layer_states`` [B, k, layers, H];
        - ``before`` [B, 1 or k, layers - 1, H]: layers 0 .. L-2's outputs at the slot before the block (None:
          nothing before, the prompt); ``chained``: the slots follow each other (``valid`` [B, k]: left holes),
          else each slot's own slot before is ``before``'s (a tree level: each node's parent)."""
        n = len(self.later_layers) + 1
        if n == 1:
            out = super().forward(features, inputs_embeds, input_ids, attention_mask, position_ids, cache,
                                  use_cache, logits_to_keep, **kwargs)
            return MtpOutput(**out, layer_states=out.hidden_states[:, :, None])
        if cache is None:  # the name before transformers 5.24
            cache = kwargs.pop("past_key_values", None)
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids)
        chosen = min(step, n - 1)
        if before is None:
            before = features.new_zeros(features.shape[0], 1, n - 1, features.shape[-1])
        outs: list[torch.Tensor] = []
        last = None
        for k, layer in enumerate(self.mtp_layers):
            if k == 0 or (k == chosen and step > k):  # layer 0, or the last layer past its step: the fed feature
                feed = features
            else:  # layer k reads layer k - 1's output at the slot before
                feed = slot_before(outs[k - 1], before[:, :, k - 1], valid, chained)
            run = layer.body(inputs_embeds=fuse(layer, self.config.hidden_first, inputs_embeds, feed),
                             attention_mask=hide_first(attention_mask, k), position_ids=position_ids,
                             **_compat.cache_kwargs(cache), use_cache=use_cache, **kwargs)
            outs.append(run.last_hidden_state)
            last = run if k == chosen else last
        hidden = outs[chosen]
        logits = self.lm_logits(hidden[:, -logits_to_keep:]) if logits_to_keep else None
        return MtpOutput(hidden_states=hidden, logits=logits, cache=_compat.output_cache(last),
                         layer_states=torch.stack(outs, 2))

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
                   hidden_first: bool | None = None, source: str | None = None, layout: str | None = None,
                   mlp_layer_types: list[str] | None = None, **unused: Any) -> "MtpDraft":
        """Randomly initialised MTP layers sized for ``target`` (its text family's decoder layer: full attention,
        or the config's ``mtp_layer_types``, Inkling's hybrids), attached to it. ``num_layers``: how many (draft
        step k runs layer k; past the last, the last one again). ``mlp_layer_types``: each layer's MLP kind where
        the family has several (Step3.7's ``mtp_mlp_layer_types``; default: the target's config's
        ``mtp_mlp_layer_types``, else its first layer's kind). ``hidden_first`` (default: the target config's
        ``mtp_hidden_states_first``), the output norm, the embedding and the logits' scale follow transformers'
        ``MtpModel`` on the target's config (see :class:`MtpDraftConfig`)."""
        if unused:
            raise ValueError(f"MtpDraft.for_target takes no {', '.join(sorted(unused))}")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be an integer >= 1 (the MTP layers), got {num_layers!r}")
        fields = head_config_fields(target, 1, target_name, kind="mtp")
        text, target_text = fields["text_config"], target.config.get_text_config()
        if isinstance(text.get("layer_types"), list):  # a hybrid's MTP layer is full attention, or as declared
            text["layer_types"] = mtp_layer_types(target_text, num_layers)
        for name in _PER_LAYER:  # every MTP layer as the one-layer config's
            if isinstance(text.get(name), list) and len(text[name]) == 1:
                text[name] = text[name] * num_layers
        mlp_layer_types = mlp_layer_types or getattr(target_text, "mtp_mlp_layer_types", None)
        if isinstance(text.get("mlp_layer_types"), list) and isinstance(mlp_layer_types, list):
            if len(mlp_layer_types) != num_layers:
                raise ValueError(f"mlp_layer_types={mlp_layer_types!r} names {len(mlp_layer_types)} MTP layers, "
                                 f"not {num_layers}")
            text["mlp_layer_types"] = list(mlp_layer_types)
        text["num_hidden_layers"] = num_layers
        if hidden_first is None:
            hidden_first = bool(getattr(target_text, "mtp_hidden_states_first", False))
        # transformers' MtpModel: no per-layer output norm where the config has chain_hidden_post_norm (then one
        # shared norm, or none), the table without its embedding norm, the logits as the target's head takes them
        chained = getattr(target_text, "chain_hidden_post_norm", None)
        post_norm = "layer" if chained is None else "shared" if chained else "none"
        config = MtpDraftConfig(hidden_first=hidden_first, source=source, layout=layout, post_norm=post_norm,
                                raw_embeddings=_compat.has_embedding_norm(target.get_input_embeddings()),
                                logits_divisor=getattr(target_text, "logits_mup_width_multiplier", None) or 1.0,
                                **fields)
        return cls(config).to_target_device(target)


def mtp_layer_types(text: Any, num_layers: int) -> list[str]:
    """The MTP layers' types on a hybrid target: its config's ``mtp_layer_types`` (Inkling's hybrids), else full
    attention (a hybrid of short convolutions and attention: its full-attention hybrid, ``"hybrid"``)."""
    declared = getattr(text, "mtp_layer_types", None)
    if isinstance(declared, list) and len(declared) == num_layers:
        return list(declared)
    return ["hybrid" if _compat.has_short_convs(text) else "full_attention"] * num_layers
