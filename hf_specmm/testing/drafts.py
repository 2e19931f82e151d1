"""Drafts built from a tiny target: exact copies of its LM, noised copies, natural-vocabulary copies,
random small LMs and an exact feature head. Family-specific parts come from the target's registered
:class:`~hf_specmm.testing.registry.FixtureFamily`."""

from __future__ import annotations

import copy

import torch
from transformers import PretrainedConfig, PreTrainedModel

from ..drafts.feature_head import FeatureHeadDraft
from ..drafts.feature_head.modeling import TARGET_ONLY_FEATURES
from .registry import fixture_of
from .shaping import BIAS_DIM, bias_channel_value, language_model


def causal_lm_config(target: PreTrainedModel) -> PretrainedConfig:
    """A copy of the config of ``target``'s language model as a plain ``*ForCausalLM`` config (Qwen-VL text
    configs have no causal-LM class of their own: Qwen2 / Qwen3)."""
    return fixture_of(target).causal_lm_config(target)


def text_draft_from_target(target: PreTrainedModel) -> PreTrainedModel:
    """Exact standalone copy of ``target``'s language model + lm_head as a ``*ForCausalLM`` (for a Qwen-VL
    target a Qwen2/Qwen3 LM: M-RoPE with equal rows is 1-D RoPE; see :func:`causal_lm_config`)."""
    text_cfg = causal_lm_config(target)
    text_cfg.tie_word_embeddings = False
    attn = getattr(target.config, "_attn_implementation", None) or "sdpa"
    draft = fixture_of(target).text_lm(text_cfg, attn)
    state = {f"model.{k}": v for k, v in language_model(target).state_dict().items()}
    state.update({f"lm_head.{k}": v for k, v in target.lm_head.state_dict().items()})
    draft.load_state_dict(state, strict=True)
    draft.generation_config = copy.deepcopy(target.generation_config)
    param = next(target.parameters())
    return draft.to(device=param.device, dtype=param.dtype).eval()


def natural_text_draft(target: PreTrainedModel, noise: float = 0.0, seed: int = 7) -> PreTrainedModel:
    """The target's LM as a text-only ``*ForCausalLM`` with the natural draft's vocabulary size: cut to the
    text ids (Vicuna's 32000 for LLaVA-1.5, gemma-3-1b's 262144, SmolLM2's 49152) or grown past the
    target's rows (Qwen2.5's 151936 for InternVL). Grown rows get a logit far above every other (a draft
    that would propose ids the target does not have, if it could). ``noise``: relative Gaussian noise on
    the LM head (a draft that agrees often, not always)."""
    size = fixture_of(target).natural_draft_vocab(target)
    draft = text_draft_from_target(target)
    old = draft.get_output_embeddings().weight.shape[0]
    draft.resize_token_embeddings(size, mean_resizing=False)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = draft.get_output_embeddings().weight
        if size > old:
            head[old:] = 0.0
            head[old:, BIAS_DIM] = 30.0 / bias_channel_value(head.shape[1])  # logit ~ +30, were it proposable
            draft.get_input_embeddings().weight[old:] = 0.0
        if noise:
            head.add_(noise * head[: min(old, size)].std() * torch.randn(head.shape, generator=gen))
    return draft.eval()


def perturb_head(model: PreTrainedModel, scale: float, seed: int = 7) -> PreTrainedModel:
    """Add ``scale`` × std Gaussian noise (seeded) to ``model``'s LM head in place: a copy of the target
    that agrees often but not always (rejections, rollbacks, partial acceptance). Returns ``model``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.add_(scale * head.std() * torch.randn(head.shape, generator=gen).to(head))
    return model


def random_text_draft(target: PreTrainedModel, seed: int = 1, vocab_size: int | None = None,
                      eos_bias: float | None = None) -> PreTrainedModel:
    """A different random 1-layer / hidden-32 causal LM of the target's LM family.

    ``vocab_size`` defaults to the target's text vocab (Qwen-VL: the natural draft's 128 rows); pass e.g.
    ``V - 4`` to mimic a text-only draft lacking the appended multimodal ids (then its pad id falls back to
    EOS).  Reserved ids of the target inside the draft vocab are suppressed as in
    :func:`~hf_specmm.testing.tiny_target`; ``eos_bias`` likewise.  Float32 on the target's device.
    """
    draft = fixture_of(target).random_draft(target, seed, vocab_size, eos_bias)
    param = next(target.parameters())
    return draft.to(device=param.device, dtype=param.dtype)


def feature_head_is_exact(target: PreTrainedModel) -> bool:
    """Whether :func:`feature_head_from_target` reproduces ``target`` exactly: not for a text stack with features a
    head's layers leave out (:data:`~hf_specmm.drafts.feature_head.modeling.TARGET_ONLY_FEATURES`: Gemma 4's
    per-layer inputs and KV sharing)."""
    text = target.config.get_text_config()
    return not any(getattr(text, name, None) for name in TARGET_ONLY_FEATURES)


def head_layer_state(target: PreTrainedModel, head: FeatureHeadDraft) -> dict[str, torch.Tensor]:
    """The target's decoder-layer weights in the head's layers' names. Gemma 4: the per-layer input path is left
    out, and a KV-shared layer (no K/V projections of its own) takes those of the layer whose K/V it reads."""
    text, state = target.config.get_text_config(), language_model(target).layers.state_dict()
    wanted = head.body.layers.state_dict()
    extra = [k for k in state if k not in wanted]
    if any("per_layer" not in k for k in extra):
        raise ValueError(f"the head's layers have no {extra}: not a copy of {type(target).__name__}'s layers")
    out = {k: v for k, v in state.items() if k in wanted}
    modes, types = getattr(text, "kv_sharing_modes", None), getattr(text, "layer_types", None)
    for key in (k for k in wanted if k not in state):  # K/V weights of a KV-shared layer: its producer's
        index, rest = key.split(".", 1)
        producer = max(j for j in range(int(index)) if modes[j] == "store" and types[j] == types[int(index)])
        out[key] = state[f"{producer}.{rest}"]
    return out


def feature_head_from_target(target: PreTrainedModel, noise: float = 0.0, seed: int = 0) -> PreTrainedModel:
    """A :class:`~hf_specmm.FeatureHeadDraft` that reproduces ``target``: as many layers as its LM, those layers
    and its final norm copied, ``fc`` reading the token embedding only (the feature half zero). Drafting with it
    is drafting with the target itself (accepted 100 %) where :func:`feature_head_is_exact`; a Gemma 4 head
    leaves out the per-layer inputs and the KV sharing (:func:`head_layer_state`): it agrees in part. ``noise``
    > 0 perturbs the copied layers (relative to each weight's std), for heads that agree often but not always."""
    lm = language_model(target)
    head = FeatureHeadDraft.for_target(target, num_layers=len(lm.layers))
    hidden = head.config.text_config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :hidden] = torch.eye(hidden)
        head.fc.bias.zero_()
        head.body.layers.load_state_dict(head_layer_state(target, head))
        head.body.norm.load_state_dict(lm.norm.state_dict())
        if noise > 0:
            gen = torch.Generator().manual_seed(seed)
            for p in head.body.layers.parameters():
                if p.dim() > 1:
                    p.add_(noise * p.std() * torch.randn(p.shape, generator=gen).to(p))
    return head.eval()
