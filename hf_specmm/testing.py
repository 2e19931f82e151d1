"""Tiny, fast, deterministic offline fixtures for tests (no Hub access needed).

Ten target families are covered: LLaVA-1.5 style (``llava``), LLaVA-NeXT anyres
(``llava_next``), LLaVA-OneVision (``llava_onevision``), Qwen2-VL / Qwen2.5-VL / Qwen3-VL
(``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``; their own id layout, see :mod:`hf_specmm.fixtures_qwen_vl`)
and, with their own upstream id layouts (``fixtures_more_vlms``, ``MORE_FAMILIES``), Gemma 3, Idefics3,
SmolVLM and InternVL.  Every model is built
from configs with random weights; every processor is built from an in-memory
``tokenizers`` WordLevel vocabulary and a PIL/numpy image processor (no
torchvision).

LLaVA id layout (``V = vocab_size``), mimicking LLaVA-1.5 (``<image>``/``<pad>`` appended
after the text vocabulary):

* ``0`` ``<unk>``, ``1`` ``<s>`` (bos), ``2`` ``</s>`` (eos), ``3 .. V-5`` plain words;
* ``V-4`` ``<image>``, ``V-3`` ``<video>`` (onevision; ``<reserved_0>`` otherwise),
  ``V-2`` ``<pad>``, ``V-1`` ``<reserved_1>``.

Ids ``>= V-4`` are *reserved*: the language models built here never predict them
(see :func:`tiny_target`).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    BatchFeature,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionProcessor,
    LlavaProcessor,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2Config,
    SiglipVisionConfig,
)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
    LlavaOnevisionImageProcessorPil,
)

from . import fixtures_qwen_vl as _qwen

__all__ = [
    "FAMILIES",
    "BOS_ID",
    "EOS_ID",
    "UNK_ID",
    "special_ids",
    "family_ids",
    "natural_text_draft",
    "vision_module",
    "tiny_target",
    "tiny_processor",
    "TinyOnevisionProcessor",
    "tiny_image",
    "make_inputs",
    "text_draft_from_target",
    "perturb_head",
    "random_text_draft",
    "causal_lm_config",
    "vision_tower",
]

from .fixtures_more_vlms import (MORE_FAMILIES, build_processor, build_target, image_marker,  # noqa: E402
                                 natural_text_draft)

LLAVA_FAMILIES = ("llava", "llava_next", "llava_onevision")
FAMILIES = LLAVA_FAMILIES + _qwen.QWEN_FAMILIES + MORE_FAMILIES
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
IMAGE_SIZE = 32
PATCH_SIZE = 8
GRID_PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64]]
_INIT_RANGE = 0.2  # larger than HF's 0.02 so random generations depend on context
_BIAS_DIM = 0  # hidden channel turned into a constant "bias channel" before the final norm
_BIAS_RATIO = 1.5  # bias channel value / max norm of the other channels (calibrated)
_LOGIT_STD = 2.0  # approximate std of ordinary-token logits
_RESERVED_LOGIT = -20.0  # approximate logit of reserved ids
_WORDS = (
    "the a an is are what which who where how color shape size red green blue yellow "
    "black white circle square triangle dog cat car tree house sky image picture photo "
    "this that there in on of and with left right top bottom small large big one two "
    "three many describe show see it has have no yes ? . , : user assistant"
).split()
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image> {% elif c['type'] == 'video' %}<video> "
    "{% elif c['type'] == 'text' %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}"
    "{% if m['role'] == 'assistant' %} </s>{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def _check(family: str, vocab_size: int) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    if vocab_size < 16:
        raise ValueError("vocab_size must be >= 16")


def special_ids(vocab_size: int = 128, family: str = "llava") -> dict[str, int]:
    """Return the reserved/special id layout for ``vocab_size`` (a Qwen-VL family: its fixed layout)."""
    if family in _qwen.QWEN_FAMILIES:
        return {"eos": _qwen.EOS_ID, "pad": _qwen.PAD_ID, "image": _qwen.IMAGE_ID, "video": _qwen.VIDEO_ID,
                "vision_start": _qwen.VISION_START_ID, "vision_end": _qwen.VISION_END_ID}
    v = vocab_size
    return {"unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID, "image": v - 4, "video": v - 3, "pad": v - 2}


def family_ids(family: str) -> dict:
    """``image``, ``pad``, ``bos`` and ``eos`` ids of ``family``'s tiny fixtures (``eos`` a list)."""
    if family in MORE_FAMILIES:
        from .fixtures_more_vlms import ids_of

        return ids_of(family)
    if family in _qwen.QWEN_FAMILIES:
        ids = special_ids(family=family)
        return {**ids, "bos": None, "eos": [ids["eos"]]}
    ids = special_ids()
    return {**ids, "eos": [ids["eos"]]}


def _text_config(family: str, vocab_size: int, hidden: int = 64, layers: int = 2,
                 heads: int = 4) -> PretrainedConfig:
    ids = special_ids(vocab_size)
    cls = Qwen2Config if family == "llava_onevision" else LlamaConfig
    kw = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=1024,
        initializer_range=_INIT_RANGE, bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"],
        tie_word_embeddings=False,
    )
    if cls is Qwen2Config:
        kw["use_sliding_window"] = False
    else:
        kw["attention_bias"] = True  # value bias needed for the lm_head bias channel
    return cls(**kw)


@torch.no_grad()
def _shape_lm(decoder: torch.nn.Module, lm_head: torch.nn.Linear, vocab_size: int, reserved: list[int],
              eos_bias: float | None, gen: torch.Generator, eos_id: int = EOS_ID,
              probe_high: int | None = None) -> None:
    """Give ``lm_head`` a per-token logit bias, without adding parameters.

    Hidden channel ``_BIAS_DIM`` is zeroed everywhere except for a constant ``c``
    written by the last layer's attention (a value-bias, which softmax passes through
    unchanged), so after the final RMSNorm it holds a nearly constant ``h0`` and
    ``lm_head[r, _BIAS_DIM]`` acts as a bias of token ``r``.  ``c`` is calibrated on a
    probe batch to ``_BIAS_RATIO`` times the largest norm of the other channels.
    """
    d = _BIAS_DIM
    decoder.embed_tokens.weight[:, d] = 0.0
    for layer in decoder.layers:
        for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
            lin.weight[d] = 0.0
            if lin.bias is not None:
                lin.bias[d] = 0.0
    attn = decoder.layers[-1].self_attn
    attn.v_proj.weight[0] = 0.0
    attn.v_proj.bias[0] = 1.0  # value dim 0 of kv-head 0 is exactly 1 after attention
    attn.o_proj.weight[:, 0] = 0.0
    seen: dict[str, torch.Tensor] = {}
    hook = decoder.norm.register_forward_hook(lambda mod, args, out: seen.update(x=args[0]))
    probe = torch.randint(3, probe_high or vocab_size - 4, (4, 48), generator=gen)
    decoder(input_ids=probe.to(lm_head.weight.device), use_cache=False)
    hook.remove()
    rest = torch.cat([seen["x"][..., :d], seen["x"][..., d + 1:]], dim=-1).norm(dim=-1).max().item()
    attn.o_proj.weight[d, 0] = _BIAS_RATIO * rest
    hidden = lm_head.weight.shape[1]
    h0 = hidden ** 0.5 * _BIAS_RATIO / (1 + _BIAS_RATIO ** 2) ** 0.5  # post-norm bias channel
    h_rest = hidden ** 0.5 / (1 + _BIAS_RATIO ** 2) ** 0.5  # post-norm norm of the other channels
    w = lm_head.weight
    w.copy_(torch.randn(w.shape, generator=gen) * (_LOGIT_STD / h_rest))
    w[:, d] = 0.0
    for r in reserved:
        if 0 <= r < w.shape[0]:
            w[r] = 0.0
            w[r, d] = _RESERVED_LOGIT / h0
    if eos_bias is not None and eos_id < w.shape[0]:
        w[eos_id, d] = eos_bias / h0


def _language_model(model: PreTrainedModel) -> torch.nn.Module:
    inner = getattr(model, "model", None)
    for name in ("language_model", "text_model"):  # text_model: Idefics3 / SmolVLM
        lm = getattr(inner, name, None) if inner is not None else None
        if lm is not None:
            return lm
    return model.get_decoder()


def vision_module(model: PreTrainedModel) -> torch.nn.Module:
    """The vision encoder of a tiny target (``vision_tower``; Idefics3 / SmolVLM: ``vision_model``;
    Qwen-VL: ``visual``)."""
    inner = model.model
    for name in ("vision_tower", "vision_model", "visual"):
        tower = getattr(inner, name, None)
        if tower is not None:
            return tower
    raise AttributeError(f"no vision encoder found on {type(model).__name__}")


def _finish(model: PreTrainedModel, pad_id: int, eos_id: int = EOS_ID) -> PreTrainedModel:
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = (BOS_ID if eos_id == EOS_ID else None), eos_id, pad_id
    return model.to(torch.float32).eval()


def tiny_target(family: str, seed: int = 0, vocab_size: int = 128, eos_bias: float | None = None) -> PreTrainedModel:
    """Build a random tiny multimodal target of ``family`` (float32, sdpa, eval mode).

    2-layer / hidden-64 LM (Llama, or Qwen2 for onevision), 2-layer / hidden-32 vision
    tower (CLIP, or SigLIP for onevision) on 32x32 images with 8x8 patches.

    Logit shaping (real LLaVA never emits ``<image>``): the lm_head rows of the
    reserved ids (``<image>``, ``<video>``, ``<pad>``, i.e. all ids ``>= V-4``) are
    zeroed except for one hidden "bias channel" (see :func:`_shape_lm`) that gives
    them a logit of about -20 at every non-padding position while ordinary logits have a std of
    about 2: they are essentially never generated, greedy or sampled.  The lm_head is
    re-drawn, so EOS is as likely as any word: ~5% of random 30-token greedy rows stop
    early.  ``eos_bias`` is an approximate logit offset for EOS (``None`` = 0; e.g.
    2.0 -> ~60% of rows stop early, 4.0 -> nearly all, -1.5 -> none).  The LM is
    initialised with ``initializer_range=0.2`` so outputs depend on context; Llama
    LMs use ``attention_bias=True`` (needed for the bias channel).
    """
    _check(family, vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if family in MORE_FAMILIES:  # fixtures_more_vlms: their own upstream id layouts
            return build_target(family, seed, eos_bias)
        return _build_target(family, seed, vocab_size, eos_bias)


def _build_target(family: str, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
    if family in _qwen.QWEN_FAMILIES:  # their own fixed id layout (vocab_size is ignored)
        return _qwen.build_target(family, seed, eos_bias, _shape_lm, _finish)
    ids = special_ids(vocab_size)
    text = _text_config(family, vocab_size)
    common = dict(text_config=text, image_token_index=ids["image"], projector_hidden_act="gelu",
                  multimodal_projector_bias=True, tie_word_embeddings=False, pad_token_id=ids["pad"])
    vis = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               image_size=IMAGE_SIZE, patch_size=PATCH_SIZE)
    if family == "llava":
        n_img = (IMAGE_SIZE // PATCH_SIZE) ** 2
        cfg = LlavaConfig(vision_config=CLIPVisionConfig(projection_dim=32, **vis), image_seq_length=n_img,
                          vision_feature_select_strategy="default", vision_feature_layer=-2, **common)
        model = LlavaForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
    elif family == "llava_next":
        cfg = LlavaNextConfig(vision_config=CLIPVisionConfig(projection_dim=32, **vis),
                              image_grid_pinpoints=GRID_PINPOINTS, vision_feature_select_strategy="default",
                              vision_feature_layer=-2, **common)
        model = LlavaNextForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
    else:
        cfg = LlavaOnevisionConfig(vision_config=SiglipVisionConfig(**vis), video_token_index=ids["video"],
                                   image_grid_pinpoints=GRID_PINPOINTS, vision_feature_select_strategy="full",
                                   vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9", **common)
        model = LlavaOnevisionForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
    with torch.no_grad():  # image features / newline carry nothing in the bias channel
        proj = model.model.multi_modal_projector.linear_2
        proj.weight[_BIAS_DIM] = 0.0
        proj.bias[_BIAS_DIM] = 0.0
        newline = getattr(model.model, "image_newline", None)
        if newline is not None:
            newline[_BIAS_DIM] = 0.0
    gen = torch.Generator().manual_seed(seed + 1000)
    reserved = list(range(vocab_size - 4, vocab_size))
    _shape_lm(_language_model(model), model.lm_head, vocab_size, reserved, eos_bias, gen)
    return _finish(model, ids["pad"])


def _tokenizer(family: str, vocab_size: int) -> PreTrainedTokenizerFast:
    ids = special_ids(vocab_size)
    n_words = vocab_size - 4 - 3
    words = list(_WORDS[:n_words]) + [f"w{i}" for i in range(max(0, n_words - len(_WORDS)))]
    video = "<video>" if family == "llava_onevision" else "<reserved_0>"
    specials = {"<unk>": UNK_ID, "<s>": BOS_ID, "</s>": EOS_ID, "<image>": ids["image"], video: ids["video"],
                "<pad>": ids["pad"], "<reserved_1>": vocab_size - 1}
    vocab = dict(specials)
    vocab.update({w: 3 + i for i, w in enumerate(words)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(sorted(specials, key=specials.get))
    if family != "llava_onevision":  # Llama-style tokenizers prepend <s>; Qwen2 does not
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        padding_side="left", model_max_length=4096, chat_template=_CHAT_TEMPLATE)
    return fast


class TinyOnevisionProcessor(LlavaOnevisionProcessor):
    """``LlavaOnevisionProcessor`` that accepts ``video_processor=None``.

    The onevision video processor needs torchvision; images and text work without it.
    """

    def check_argument_for_proper_class(self, argument_name: str, argument: object) -> type | None:
        if argument is None and argument_name == "video_processor":
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


def tiny_processor(family: str, vocab_size: int = 128) -> ProcessorMixin:
    """Build the real transformers processor of ``family`` matching :func:`tiny_target`.

    The tokenizer is an offline WordLevel model (whitespace pre-tokenizer, left
    padding, simple chat template); the image processor is the PIL backend (no
    torchvision) sized for 32x32 inputs.  Placeholder expansion parameters
    (``patch_size``, ``vision_feature_select_strategy``, ...) match the tiny model.
    """
    _check(family, vocab_size)
    if family in _qwen.QWEN_FAMILIES:
        return _qwen.processor(family, ["!", '"', "#"] + list(_WORDS) + [f"w{i}" for i in range(_qwen.N_WORDS)])
    if family in MORE_FAMILIES:
        return build_processor(family)
    tok = _tokenizer(family, vocab_size)
    img_kw = dict(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    if family == "llava":
        return LlavaProcessor(image_processor=CLIPImageProcessorPil(**img_kw), tokenizer=tok, patch_size=PATCH_SIZE,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=_CHAT_TEMPLATE)
    if family == "llava_next":
        ip = LlavaNextImageProcessorPil(image_grid_pinpoints=GRID_PINPOINTS, **img_kw)
        return LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=PATCH_SIZE,
                                  vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                  chat_template=_CHAT_TEMPLATE)
    ip = LlavaOnevisionImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                         image_grid_pinpoints=GRID_PINPOINTS)
    return TinyOnevisionProcessor(image_processor=ip, tokenizer=tok, video_processor=None,
                                   num_image_tokens=(IMAGE_SIZE // PATCH_SIZE) ** 2,
                                   vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
                                   chat_template=_CHAT_TEMPLATE)


def tiny_image(seed: int, size: tuple[int, int] = (32, 32)) -> Image.Image:
    """Deterministic random RGB image of ``size = (width, height)``."""
    rng = np.random.default_rng(seed)
    w, h = size
    return Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8), mode="RGB")


def make_inputs(family: str, processor: ProcessorMixin, prompts: list[str], images: list[Image.Image | None],
                padding_side: str = "left", videos: list | None = None) -> BatchFeature:
    """Process a batch where row ``i`` has ``images[i]`` (or no image when ``None``).

    A row with an image whose prompt lacks ``<image>`` gets ``"<image> "`` prepended.
    Rows are padded on ``padding_side`` (left by default, as needed for generate).
    Qwen-VL families: each row is a one-turn chat with ``<|vision_start|><|image_pad|><|vision_end|>``
    per image before the prompt; ``images[i]`` may be a list (several images), ``videos[i]`` a
    ``(frames, (w, h), seed)`` video built as tensors (see :func:`hf_specmm.fixtures_qwen_vl.make_inputs`).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}")
    if len(prompts) != len(images):
        raise ValueError("prompts and images must have the same length")
    if family in _qwen.QWEN_FAMILIES:
        return _qwen.make_inputs(family, processor, prompts, images, videos, padding_side)
    marker = image_marker(family) if family in MORE_FAMILIES else "<image>"
    texts = [p if img is None or marker in p else f"{marker} {p}" for p, img in zip(prompts, images)]
    present = [img for img in images if img is not None]
    if family in MORE_FAMILIES and present:  # these processors take the images of each row as a list
        present = [[] if img is None else [img] for img in images]
    processor.tokenizer.padding_side = padding_side
    return processor(images=present or None, text=texts, padding=True, return_tensors="pt")


def text_draft_from_target(target: PreTrainedModel) -> PreTrainedModel:
    """Exact standalone copy of ``target``'s language model + lm_head as a ``*ForCausalLM`` (for a Qwen-VL
    target a Qwen2/Qwen3 LM: M-RoPE with equal rows is 1-D RoPE; see :func:`causal_lm_config`)."""
    text_cfg = causal_lm_config(target)
    text_cfg.tie_word_embeddings = False
    attn = getattr(target.config, "_attn_implementation", None) or "sdpa"
    draft = AutoModelForCausalLM.from_config(text_cfg, attn_implementation=attn)
    state = {f"model.{k}": v for k, v in _language_model(target).state_dict().items()}
    state.update({f"lm_head.{k}": v for k, v in target.lm_head.state_dict().items()})
    result = draft.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    draft.generation_config = copy.deepcopy(target.generation_config)
    param = next(target.parameters())
    return draft.to(device=param.device, dtype=param.dtype).eval()


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

    ``vocab_size`` defaults to the target's text vocab; pass e.g. ``V - 4`` to mimic a
    text-only draft lacking the appended multimodal ids (then its pad id falls back to
    EOS).  Reserved ids of the target inside the draft vocab are suppressed as in
    :func:`tiny_target`; ``eos_bias`` likewise.  Float32 on the target's device.
    """
    if target.config.model_type in _qwen.QWEN_FAMILIES:  # default: the natural draft's 128 rows (151936 upstream)
        return _qwen.random_text_draft(target, seed, vocab_size, eos_bias, _shape_lm, _finish)
    text = target.config.text_config
    vocab = vocab_size or text.vocab_size
    family = "llava_onevision" if text.model_type == "qwen2" else "llava"
    cfg = _text_config(family, vocab, hidden=32, layers=1, heads=4)
    pad = text.pad_token_id if text.pad_token_id is not None and text.pad_token_id < vocab else EOS_ID
    cfg.pad_token_id = pad
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        gen = torch.Generator().manual_seed(seed + 1000)
        reserved = list(range(text.vocab_size - 4, text.vocab_size))
        _shape_lm(draft.model, draft.lm_head, vocab, reserved, eos_bias, gen)
    param = next(target.parameters())
    return _finish(draft, pad).to(device=param.device, dtype=param.dtype)


def causal_lm_config(target: PreTrainedModel) -> PretrainedConfig:
    """A copy of the config of ``target``'s language model as a plain ``*ForCausalLM`` config (Qwen-VL text
    configs have no causal-LM class of their own: Qwen2 / Qwen3)."""
    if target.config.model_type in _qwen.QWEN_FAMILIES:
        return _qwen.text_config(target.config.text_config)
    return copy.deepcopy(target.config.text_config)


def feature_head_from_target(target: PreTrainedModel, noise: float = 0.0, seed: int = 0) -> PreTrainedModel:
    """A :class:`~hf_specmm.FeatureHeadDraft` that reproduces ``target`` exactly: as many layers as its LM,
    those layers and its final norm copied, ``fc`` reading the token embedding only (the feature half zero).
    Drafting with it is drafting with the target itself (accepted 100 %). ``noise`` > 0 perturbs the copied
    layers (relative to each weight's std), for heads that agree often but not always."""
    from .drafts.feature_head import FeatureHeadDraft

    lm = _language_model(target)
    head = FeatureHeadDraft.for_target(target, num_layers=len(lm.layers))
    hidden = head.config.text_config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :hidden] = torch.eye(hidden)
        head.fc.bias.zero_()
        head.body.layers.load_state_dict(lm.layers.state_dict())
        head.body.norm.load_state_dict(lm.norm.state_dict())
        if noise > 0:
            gen = torch.Generator().manual_seed(seed)
            for p in head.body.layers.parameters():
                if p.dim() > 1:
                    p.add_(noise * p.std() * torch.randn(p.shape, generator=gen).to(p))
    return head.eval()
