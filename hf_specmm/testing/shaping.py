"""Logit shaping shared by every fixture family: what makes a random tiny LM behave like a real VLM's.

A real VLM never writes ``<image>``, its pads or the rows beyond its tokenizer, and its outputs depend on
context. Random weights do neither, so each tiny LM is reshaped *without adding parameters*: hidden
channel :data:`BIAS_DIM` becomes a constant "bias channel" before the final norm, and ``lm_head[r,
BIAS_DIM]`` then acts as a per-token logit bias (reserved ids get about :data:`RESERVED_LOGIT`, ordinary
ids a std of about :data:`LOGIT_STD`). The LMs are initialised with ``initializer_range`` =
:data:`INIT_RANGE` (HF's 0.02 would make generations nearly context-free).

    >>> from hf_specmm.testing import shaping
    >>> round(shaping.bias_channel_value(64), 2)  # the post-norm value of the bias channel, hidden size 64
    6.66
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, PreTrainedModel, Qwen2Config

INIT_RANGE = 0.2  # larger than HF's 0.02 so random generations depend on context
BIAS_DIM = 0  # hidden channel turned into a constant "bias channel" before the final norm
BIAS_RATIO = 1.5  # bias channel value / max norm of the other channels (calibrated)
LOGIT_STD = 2.0  # approximate std of ordinary-token logits
RESERVED_LOGIT = -20.0  # approximate logit of reserved ids
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2  # the LLaMA-style layout of the default small LMs
WORDS = tuple((
    "the a an is are what which who where how color shape size red green blue yellow "
    "black white circle square triangle dog cat car tree house sky image picture photo "
    "this that there in on of and with left right top bottom small large big one two "
    "three many describe show see it has have no yes ? . , : user assistant"
).split())


def words(n: int) -> list[str]:
    """``n`` distinct words: :data:`WORDS` first, then ``w0``, ``w1``, ..."""
    return list(WORDS[:n]) + [f"w{i}" for i in range(max(0, n - len(WORDS)))]


def bias_channel_value(hidden: int) -> float:
    """The bias channel's value after the final RMSNorm (``h0``): ``lm_head[r, BIAS_DIM] = logit / h0``."""
    return hidden ** 0.5 * BIAS_RATIO / (1 + BIAS_RATIO ** 2) ** 0.5


def other_channels_norm(hidden: int) -> float:
    """The post-norm norm of the channels other than the bias channel."""
    return hidden ** 0.5 / (1 + BIAS_RATIO ** 2) ** 0.5


def small_lm_config(qwen2: bool, vocab_size: int, bos: int | None, eos: int, pad: int, hidden: int = 64,
                    layers: int = 2, heads: int = 4) -> PretrainedConfig:
    """A Llama (or Qwen2) text config sized for the fixtures; Llama gets ``attention_bias`` (the value bias
    that writes the bias channel, see :func:`shape_lm`)."""
    kw = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=1024,
        initializer_range=INIT_RANGE, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
        tie_word_embeddings=False,
    )
    if qwen2:
        return Qwen2Config(use_sliding_window=False, **kw)
    return LlamaConfig(attention_bias=True, **kw)


@torch.no_grad()
def shape_lm(decoder: torch.nn.Module, lm_head: torch.nn.Linear, vocab_size: int, reserved: list[int],
             eos_bias: float | None, gen: torch.Generator, eos_id: int = EOS_ID,
             probe_high: int | None = None) -> None:
    """Give ``lm_head`` a per-token logit bias, without adding parameters.

    Hidden channel ``BIAS_DIM`` is zeroed everywhere except for a constant ``c`` written by the last
    layer's attention (a value-bias, which softmax passes through unchanged), so after the final RMSNorm it
    holds a nearly constant ``h0`` and ``lm_head[r, BIAS_DIM]`` acts as a bias of token ``r``.  ``c`` is
    calibrated on a probe batch to ``BIAS_RATIO`` times the largest norm of the other channels. The head is
    re-drawn (ordinary logits: std ``LOGIT_STD``); ``reserved`` ids get ``RESERVED_LOGIT``, ``eos_id``
    gets ``eos_bias`` (``None``: no bias).
    """
    d = BIAS_DIM
    decoder.embed_tokens.weight[:, d] = 0.0
    for layer in decoder.layers:
        mixer = getattr(layer, "self_attn", None) or layer.linear_attn  # Qwen3.5: linear-attention layers
        experts = getattr(layer.mlp, "experts", None)  # a sparse MoE block: experts' stacked [E, hidden, inter]
        if experts is not None:
            experts.down_proj[:, d] = 0.0
        dense = () if experts is not None else (layer.mlp.down_proj,)
        shared = getattr(layer.mlp, "shared_expert", None)  # Qwen3.5-MoE: a gated shared expert beside them
        dense += () if shared is None else (shared.down_proj,)
        for lin in (getattr(mixer, "o_proj", None) or mixer.out_proj,) + dense:
            lin.weight[d] = 0.0
            if lin.bias is not None:
                lin.bias[d] = 0.0
    attn = decoder.layers[-1].self_attn
    attn.v_proj.weight[0] = 0.0
    attn.v_proj.bias[0] = 1.0  # value dim 0 of kv-head 0 is exactly 1 after attention
    if attn.q_proj.out_features == 2 * attn.o_proj.in_features:  # gated attention (Qwen3.5): open channel 0's gate
        gate = attn.head_dim  # per head: head_dim query rows, then head_dim gate rows
        attn.q_proj.weight[gate] = 0.0
        attn.q_proj.bias[gate] = 30.0
    attn.o_proj.weight[:, 0] = 0.0
    seen: dict[str, torch.Tensor] = {}
    hook = decoder.norm.register_forward_hook(lambda mod, args, out: seen.update(x=args[0]))
    probe = torch.randint(3, probe_high or vocab_size - 4, (4, 48), generator=gen)
    decoder(input_ids=probe.to(lm_head.weight.device), use_cache=False)
    hook.remove()
    rest = torch.cat([seen["x"][..., :d], seen["x"][..., d + 1:]], dim=-1).norm(dim=-1).max().item()
    attn.o_proj.weight[d, 0] = BIAS_RATIO * rest
    hidden = lm_head.weight.shape[1]
    h0 = bias_channel_value(hidden)
    w = lm_head.weight
    w.copy_(torch.randn(w.shape, generator=gen) * (LOGIT_STD / other_channels_norm(hidden)))
    w[:, d] = 0.0
    for r in reserved:
        if 0 <= r < w.shape[0]:
            w[r] = 0.0
            w[r, d] = RESERVED_LOGIT / h0
    if eos_bias is not None and eos_id < w.shape[0]:
        w[eos_id, d] = eos_bias / h0


def language_model(model: PreTrainedModel) -> torch.nn.Module:
    """The text decoder of a tiny target (``language_model``; Idefics3 / SmolVLM: ``text_model``)."""
    inner = getattr(model, "model", None)
    for name in ("language_model", "text_model"):
        lm = getattr(inner, name, None) if inner is not None else None
        if lm is not None:
            return lm
    return model.get_decoder()


def vision_module(model: PreTrainedModel) -> torch.nn.Module:
    """The vision encoder of a tiny target (``vision_tower``; Idefics3 / SmolVLM: ``vision_model``;
    Qwen-VL: ``visual``; Gemma 4 Unified, encoder-free: ``embed_vision``)."""
    inner = model.model
    for name in ("vision_tower", "vision_model", "visual", "embed_vision"):
        tower = getattr(inner, name, None)
        if tower is not None:
            return tower
    raise AttributeError(f"no vision encoder found on {type(model).__name__}")


def finish(model: PreTrainedModel, pad_id: int, eos_id: int | list[int] = EOS_ID,
           bos_id: int | None = BOS_ID) -> PreTrainedModel:
    """Write the generation config's special ids; float32, eval mode."""
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = bos_id, eos_id, pad_id
    return model.to(torch.float32).eval()


def llama_random_draft(target: PreTrainedModel, seed: int, vocab_size: int | None,
                       eos_bias: float | None) -> PreTrainedModel:
    """A random 1-layer / hidden-32 Llama (Qwen2 for a Qwen2 text config) in the LLaMA-style layout
    (``<unk> <s> </s>`` first, the target's last 4 text ids reserved); the default random draft."""
    text = target.config.get_text_config()
    vocab = vocab_size or text.vocab_size
    pad = text.pad_token_id if text.pad_token_id is not None and text.pad_token_id < vocab else EOS_ID
    cfg = small_lm_config(text.model_type == "qwen2", vocab, BOS_ID, EOS_ID, pad, hidden=32, layers=1, heads=4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        gen = torch.Generator().manual_seed(seed + 1000)
        shape_lm(draft.model, draft.lm_head, vocab, list(range(text.vocab_size - 4, text.vocab_size)), eos_bias, gen)
    return finish(draft, pad)
