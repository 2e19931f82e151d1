"""``Eagle3FeatureHead``: an EAGLE-3 draft head (the ``feature_head`` kind's ``eagle3`` variant).

Where the EAGLE-1 head reads the target's last hidden state, EAGLE-3 reads three of its layers (low,
middle, high) and fuses them::

    h_t = fc([a_t; b_t; c_t])                        (a, b, c: inputs of the target's decoder layers ``aux_layers``)
    g_{t+1} = layers([norm_e(emb(x_{t+1})); norm_h(h_t)], residual h_t)        (pre-norm output, fed back)
    logits_{t+1} = lm_head(norm(g_{t+1}))  over the draft vocabulary, mapped to target ids by ``d2t``

Three options of ``speculators`` 0.9 (config fields of the same names, off by default) change that:
``norm_before_fc`` normalises the fused input first, ``fc(input_norm([a; b; c]))`` (one RMSNorm over all 3H,
gpt-oss style); ``fc_norm`` normalises each captured layer on its own, ``fc([n_a(a); n_b(b); n_c(c)])``
(the two are exclusive); ``norm_output`` (EAGLE 3.1) feeds the *normed* output back, g = norm(layers(...)),
and the LM head reads g as it is.

While drafting, the next step's h is the head's own g (no ``fc``): a feature of width 3H goes through
``fc``, one of width H is already fused. The draft vocabulary is the ``draft_vocab_size`` target ids the
head may propose (the most frequent ones of the training answers); ``d2t[i]`` is the offset of draft id i
(target id = i + d2t[i]) and ``t2d`` marks the chosen target ids: the tensors and semantics of the
``speculators`` / vLLM / SGLang checkpoints (see :mod:`.formats`).

The layers are Llama decoder layers (the layer every serving engine runs for EAGLE-3; the first one's
attention reads [embedding; feature], 2H wide, and it has the extra ``hidden_norm``), inside the target
family's own text model (its rotary embedding, M-RoPE for Qwen-VL, masks and position rule): so the
head's slots sit at the target's positions, as the EAGLE-1 head's do. Gemma 4's text model runs each
layer with its per-layer input and per-layer-type rotary embedding (head size of its own), which a Llama
layer does not take: there the body is a Llama model of the layer config (Gemma 4's positions are 1-D,
numbered as a Llama body numbers them; the full-attention RoPE of the target, as every head's).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel, PretrainedConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from ... import _compat
from ...errors import IncompatibleDraftError
from .configuration import default_aux_layers
from .eagle3_config import Eagle3HeadConfig, layer_config_for
from .export import export_head
from .modeling import FeatureHeadDraft, FeatureHeadOutput, family_body, head_config_fields
from .validation import check_vocab_maps, too_few_aux_layers


# text models whose decoder loop a Llama layer cannot run in (Gemma 4: per-layer inputs passed positionally,
# rotary embeddings per layer type): the head's body is a Llama model of its layer config
LLAMA_BODY_MODEL_TYPES = ("gemma4_text", "gemma4_unified_text")


def eagle3_body(text: PretrainedConfig, layer: LlamaConfig) -> nn.Module:
    """The model around the head's layers: the target family's text model (its positions, rotary embedding
    and masks), or a Llama model for :data:`LLAMA_BODY_MODEL_TYPES`; no token table (dropped)."""
    if getattr(text, "model_type", None) not in LLAMA_BODY_MODEL_TYPES:
        return family_body(text)
    body_config = LlamaConfig(**{**layer.to_dict(), "vocab_size": 1, "pad_token_id": None, "bos_token_id": None,
                                 "eos_token_id": None})
    body_config._attn_implementation = layer._attn_implementation
    body = LlamaModel(body_config)
    body.set_input_embeddings(None)
    return body


class Eagle3FirstLayer(LlamaDecoderLayer):
    """A Llama decoder layer whose attention reads [input_layernorm(embedding); hidden_norm(feature)] (2H
    wide) and whose residual stream starts from the feature (normed first when ``norm_before_residual``)."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False):
        super().__init__(config, layer_idx=0)
        width, attn = 2 * config.hidden_size, self.self_attn
        self.self_attn.q_proj = nn.Linear(width, attn.q_proj.out_features, bias=config.attention_bias)
        self.self_attn.k_proj = nn.Linear(width, attn.k_proj.out_features, bias=config.attention_bias)
        self.self_attn.v_proj = nn.Linear(width, attn.v_proj.out_features, bias=config.attention_bias)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        embeds, feature = hidden_states.chunk(2, dim=-1)
        normed = self.hidden_norm(feature)
        residual = normed if self.norm_before_residual else feature
        attended, _ = self.self_attn(hidden_states=torch.cat([self.input_layernorm(embeds), normed], -1), **kwargs)
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3FeatureHead(FeatureHeadDraft):
    """EAGLE-3 head tied to one target (its embedding is used, not stored). Pass it as ``assistant_model``.

    Example::

        >>> import hf_specmm
        >>> from hf_specmm import testing
        >>> target = testing.tiny_target("llava")
        >>> head = hf_specmm.FeatureHeadDraft.for_target(target, variant="eagle3", draft_vocab_size=64)
        >>> hf_specmm.enable(target)  # doctest: +ELLIPSIS
        Llava...
        >>> inputs = testing.make_inputs("llava", testing.tiny_processor("llava"), ["hi"], [testing.tiny_image(0)])
        >>> out = target.generate(**inputs, assistant_model=head, max_new_tokens=8)
    """

    variant = "eagle3"

    config_class = Eagle3HeadConfig
    save_formats = ("hf_specmm", "speculators", "sglang")

    def build_modules(self, config: Eagle3HeadConfig) -> None:
        layer = config.layer_config
        layer._attn_implementation = config.text_config._attn_implementation or "sdpa"
        hidden = layer.hidden_size
        if hidden != config.text_config.hidden_size:
            raise ValueError(f"an EAGLE-3 head's hidden size ({hidden}) must be its target's "
                             f"({config.text_config.hidden_size}): it reads the target's token embeddings")
        self.fc = nn.Linear(len(config.aux_layers) * hidden, hidden, bias=False)
        # speculators' names (input_norm, fc_norm.<i>): its checkpoints load with every key checked
        self.input_norm = LlamaRMSNorm(self.fc.in_features, eps=layer.rms_norm_eps) if config.norm_before_fc else None
        self.fc_norm = nn.ModuleList([LlamaRMSNorm(hidden, eps=layer.rms_norm_eps) for _ in config.aux_layers]) \
            if config.fc_norm else None
        self.body = eagle3_body(config.text_config, layer)  # positions, rotary, masks of the target's family
        self.body.layers = nn.ModuleList(
            [Eagle3FirstLayer(layer, config.norm_before_residual)]
            + [LlamaDecoderLayer(layer, i) for i in range(1, layer.num_hidden_layers)])
        self.body.norm = nn.Identity()  # ``norm`` is the head's: for the logits, or on the output (norm_output)
        self.norm = LlamaRMSNorm(hidden, eps=layer.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        vocab = int(layer.vocab_size)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(vocab, dtype=torch.bool))
        self.t2d[: config.draft_vocab_size] = True  # the first ids until a vocabulary is chosen

    def _init_weights(self, module: nn.Module) -> None:
        if module is self:  # the vocabulary maps are data, not weights
            return
        super()._init_weights(module)

    # ---- the draft vocabulary ------------------------------------------------------------------------
    @property
    def draft_ids(self) -> torch.Tensor:
        """[Vd] the target id of each draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Make the head's vocabulary the ``draft_vocab_size`` distinct ``target_ids`` (kept in increasing
        order: every offset ``d2t`` is then >= 0, as the engines store them)."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).flatten().unique(sorted=True)
        if ids.numel() != self.d2t.numel() or int(ids.min()) < 0 or int(ids.max()) >= self.t2d.numel():
            raise ValueError(f"a draft vocabulary of {self.d2t.numel()} distinct ids in [0, {self.t2d.numel()}) is "
                             f"needed, got {ids.numel()} distinct ids in [{int(ids.min())}, {int(ids.max())}]")
        with torch.no_grad():
            self.d2t.copy_(ids.to(self.d2t.device) - torch.arange(ids.numel(), device=self.d2t.device))
            self.t2d.zero_()
            self.t2d[ids.to(self.t2d.device)] = True

    def select_draft_vocab(self, counts: torch.Tensor) -> torch.Tensor:
        """Choose the vocabulary from ``counts`` [V] (occurrences of each target id in the training answers):
        the most frequent ids, ties to the smaller id. Returns the chosen ids."""
        order = torch.argsort(-counts.to(torch.float64).cpu(), stable=True)
        chosen = order[: self.d2t.numel()].sort().values
        self.set_draft_vocab(chosen)
        return chosen

    # ---- forward -------------------------------------------------------------------------------------
    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [.., k·H] through ``fc``; the head's own features [.., H] as they are."""
        dtype = self.fc.weight.dtype
        features = features.to(device=self.fc.weight.device, dtype=dtype)
        if features.shape[-1] == self.fc.out_features:
            return features
        if self.input_norm is not None:
            features = self.input_norm(features)
        if self.fc_norm is not None:
            parts = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts)], -1)
        return self.fc(features)

    def forward(self, features: torch.Tensor, inputs_embeds: torch.Tensor | None = None,
                input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool = False,
                logits_to_keep: int = 0, **kwargs: Any) -> FeatureHeadOutput:
        """``features`` [B, k, 3H] (target layers' inputs, concatenated) or [B, k, H] (the head's own
        outputs), the next tokens as ``inputs_embeds`` or ``input_ids`` -> outputs g (pre-norm; normed with
        ``norm_output``): what the next step reads as its feature."""
        if cache is None:  # the name before transformers 5.24
            cache = kwargs.pop("past_key_values", None)
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids)
        fused = self.fuse(features)
        joined = torch.cat([inputs_embeds.to(device=fused.device, dtype=fused.dtype), fused], -1)
        out = self.body(inputs_embeds=joined, attention_mask=attention_mask, position_ids=position_ids,
                        **_compat.cache_kwargs(cache), use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state
        if self.config.norm_output:  # EAGLE 3.1: the normed state is fed back (and the LM head reads it as is)
            hidden = self.norm(hidden)
        logits = self.lm_logits(hidden[:, -logits_to_keep:]) if logits_to_keep else None
        return FeatureHeadOutput(hidden_states=hidden, logits=logits, cache=_compat.output_cache(out))

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., Vd] logits over the draft vocabulary of :meth:`forward`'s outputs."""
        hidden = hidden.to(device=self.fc.weight.device, dtype=self.fc.weight.dtype)
        return self.lm_head(hidden if self.config.norm_output else self.norm(hidden))

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., V] target-vocabulary logits: the draft vocabulary's at their target ids, -inf elsewhere."""
        small = self.draft_logits(hidden)
        full = small.new_full((*small.shape[:-1], self.t2d.numel()), float("-inf"))
        return full.index_copy(-1, self.draft_ids.to(small.device), small)

    def check_loaded(self, where: str) -> None:
        """The vocabulary maps of a loaded checkpoint: every draft id mapped to a distinct target id."""
        check_vocab_maps(self.d2t, self.t2d, where)

    # ---- the target ------------------------------------------------------------------------------------
    def check_target(self, target: PreTrainedModel) -> None:
        """Shapes first (hidden size, vocabulary, layers: a checkpoint imported from another format records no
        fingerprint), then the fingerprint of the target's weights when the head records one."""
        config, text = self.config, target.config.get_text_config()
        made_for = config.target or config.target_class or "another target"
        layers = int(text.num_hidden_layers)
        vocab = int(target.get_input_embeddings().weight.shape[0])
        problems = []
        if int(text.hidden_size) != int(config.layer_config.hidden_size):
            problems.append(f"hidden size {text.hidden_size} (the head's layer_config.hidden_size is "
                            f"{config.layer_config.hidden_size})")
        if vocab != self.t2d.numel():
            problems.append(f"vocabulary of {vocab} ids (the head maps {self.t2d.numel()}: its "
                            "layer_config.vocab_size)")
        if max(config.aux_layers) > layers or (config.target_num_layers and config.target_num_layers != layers):
            problems.append(f"{layers} decoder layers (the head reads the inputs of layers {config.aux_layers}"
                            + (f" of a {config.target_num_layers}-layer target" if config.target_num_layers else "")
                            + ": its aux_layers / target_num_layers)")
        if problems:
            raise IncompatibleDraftError(
                f"This EAGLE-3 head was made for {made_for}, not for this {type(target).__name__}: the target has "
                + "; ".join(problems) + ". Use a head made for this target (FeatureHeadDraft.for_target(target, "
                "variant='eagle3'), then train it).")
        if not self.d2t.is_meta:  # the maps' entries (a head laid out before loading has only their shapes)
            check_vocab_maps(self.d2t, self.t2d, f"This EAGLE-3 head (made for {made_for})", vocab, IncompatibleDraftError)
        if config.target_fingerprint is not None:
            super().check_target(target)

    # ---- construction, saving ------------------------------------------------------------------------
    @classmethod
    def for_target(cls, target: PreTrainedModel, num_layers: int = 1, target_name: str | None = None,
                   aux_layers: list[int] | None = None, draft_vocab_size: int | None = None,
                   norm_before_residual: bool = False, norm_before_fc: bool = False, fc_norm: bool = False,
                   norm_output: bool = False, **kwargs: Any) -> "Eagle3FeatureHead":
        """A randomly initialised EAGLE-3 head for ``target``: ``aux_layers`` (default
        :func:`default_aux_layers`), ``draft_vocab_size`` rows (default: the whole vocabulary; the first
        ids until :meth:`select_draft_vocab`), ``num_layers`` decoder layers; the norm options as
        :class:`Eagle3HeadConfig` describes them."""
        if kwargs.pop("variant", "eagle3") != "eagle3" or kwargs:
            raise ValueError(f"Eagle3FeatureHead.for_target: unexpected arguments {sorted(kwargs)}")
        fields = head_config_fields(target, num_layers, target_name, kind="eagle3")
        if isinstance(fields["text_config"].get("layer_types"), list):  # Llama layers attend to the whole context
            fields["text_config"]["layer_types"] = ["full_attention"] * num_layers
        rope = fields["text_config"].get("rope_parameters")
        if isinstance(rope, dict) and rope.get("partial_rotary_factor", 1.0) != 1.0:  # Qwen3.5: Llama layers rotate
            fields["text_config"]["rope_parameters"] = {**rope, "partial_rotary_factor": 1.0}  # the whole head
        text = target.config.get_text_config()
        depth, vocab = int(text.num_hidden_layers), int(target.get_input_embeddings().weight.shape[0])
        aux = list(aux_layers) if isinstance(aux_layers, (list, tuple)) else aux_layers
        if aux is None:
            aux = default_aux_layers(depth)
        elif (not isinstance(aux, list) or not aux
              or any(isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= depth for k in aux)):
            raise ValueError(f"aux_layers={aux_layers!r}: a list of layer inputs 0..{depth} (integers) of this "
                             f"{depth}-layer target ({depth}: the last layer's output)")
        if too_few_aux_layers(aux):
            raise ValueError(too_few_aux_layers(aux))
        size = vocab if draft_vocab_size is None else draft_vocab_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= vocab:
            raise ValueError(f"draft_vocab_size={draft_vocab_size!r}: an integer between 1 and the target's {vocab} ids")
        config = Eagle3HeadConfig(layer_config=layer_config_for(text, num_layers, vocab).to_dict(),
                                  aux_layers=[int(k) for k in aux], draft_vocab_size=size,
                                  norm_before_residual=norm_before_residual, target_num_layers=depth,
                                  norm_before_fc=norm_before_fc, fc_norm=fc_norm, norm_output=norm_output, **fields)
        return cls(config).to_target_device(target)

    def save_pretrained(self, save_directory: Any, *args: Any, format: str = "hf_specmm", **kwargs: Any) -> None:
        """``format="hf_specmm"`` (default: config, safetensors, model card), ``"speculators"`` (vLLM's
        ``--speculative-config '{"method": "eagle3", "model": PATH}'``) or ``"sglang"`` (SGLang /
        SpecForge's ``LlamaForCausalLMEagle3``)."""
        self.check_save_format(format)
        if format == "hf_specmm":
            return super().save_pretrained(save_directory, *args, **kwargs)
        if args or kwargs:
            raise ValueError(f"save_pretrained(format={format!r}) writes config.json and model.safetensors only; it "
                             f"takes no other options (got {sorted(kwargs) or list(args)})")
        export_head(self.config, self.state_dict(), save_directory, format)
