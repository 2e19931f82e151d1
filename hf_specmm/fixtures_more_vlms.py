"""Tiny offline fixtures for the Gemma 3, Idefics3, SmolVLM and InternVL targets (used by ``testing``).

Each target is built from configs with its real class and the upstream token layout scaled down; each
processor is the family's real transformers processor over an in-memory ``tokenizers`` WordLevel
vocabulary and its PIL image processor (no torchvision). Id layouts (``V`` = the target's LM-head rows):

* ``gemma3`` (Gemma tokenizer: image soft token appended after the text vocabulary, rows padded as
  gemma-3-4b's 262208): ``0 <pad> 1 <eos> 2 <bos> 3 <unk> 4 <start_of_turn> 5 <end_of_turn>``, words,
  ``100 <start_of_image> 101 <end_of_image>`` (inside the text vocabulary, as 255999/256000),
  ``128 <image_soft_token>`` (= the natural draft's vocabulary size, as 262144), ``V = 136``. EOS:
  ``<eos>`` and ``<end_of_turn>``. A full-attention layer, then two sliding-window layers (window 16).
* ``idefics3`` / ``smolvlm`` (SmolVLM tokenizer: SmolLM2's 49152 ids, then ``<global-img>``, the 36
  ``<row_i_col_j>``, ``<fake_token_around_image>``, ``<image>`` ... ``<end_of_utterance>`` = 49279):
  ``0 <|endoftext|> 1 <|im_start|> 2 <|im_end|>``, words, ``96 <global-img> 97..132 <row_i_col_j>
  133 <fake_token_around_image> 134 <image> 135 <end_of_utterance>`` (EOS), ``V = 136``; the natural
  draft's vocabulary is 96. Images are split into up to 2 x 2 tiles of 32 px plus a global view.
* ``internvl`` (Qwen2.5 tokenizer + ``<img> </img> <IMG_CONTEXT> <quad> </quad> <ref> </ref> <box>
  </box>``, InternVL3-hf's 151674 rows): ``0 <|endoftext|> 1 <|im_start|> 2 <|im_end|>``, words,
  ``119 <img> 120 </img> 121 <IMG_CONTEXT> 122..127``, ``V = 128``; the natural draft's vocabulary is
  LARGER (144, as Qwen2.5's 151936). Images are cropped into up to 4 tiles of 32 px plus a thumbnail.
  (The InternVL processor wants a ``video_token``: ``<video>`` is added to the tokenizer as id 128, past
  the model's rows; the fixtures never use it.)

As for the LLaVA fixtures, the LM heads are shaped so that image/layout ids and padding rows get a
logit of about -20 (never generated) and outputs depend on context (``initializer_range`` 0.2).
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3Processor,
    Gemma3TextConfig,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3Processor,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2Config,
    SiglipVisionConfig,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMProcessor,
)
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.internvl.configuration_internvl import InternVLVisionConfig
from transformers.models.smolvlm.configuration_smolvlm import SmolVLMVisionConfig
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

MORE_FAMILIES = ("gemma3", "idefics3", "smolvlm", "internvl")
IMAGE_SIZE, PATCH_SIZE, TOKENS_PER_TILE = 32, 8, 4
_INIT_RANGE = 0.2
_D = 0  # the hidden "bias channel" (see testing._shape_lm)

_ROWCOL = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
LAYOUTS: dict[str, dict[str, Any]] = {
    "gemma3": dict(
        vocab=136, text_end=128, head=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        inner={"<start_of_image>": 100, "<end_of_image>": 101}, tail=["<image_soft_token>"], tail_start=128,
        pad="<pad>", eos=["<eos>", "<end_of_turn>"], bos="<bos>", unk="<unk>", image="<image_soft_token>",
        marker="<start_of_image>", draft_vocab=128),
    "idefics3": dict(
        vocab=136, text_end=96, head=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        tail=["<global-img>", *_ROWCOL, "<fake_token_around_image>", "<image>", "<end_of_utterance>"],
        tail_start=96, pad="<|endoftext|>", eos=["<end_of_utterance>"], bos=None, unk="<|endoftext|>",
        image="<image>", marker="<image>", draft_vocab=96),
    "internvl": dict(
        vocab=128, text_end=119, head=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        tail=["<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>"],
        tail_start=119, pad="<|endoftext|>", eos=["<|im_end|>", "<|endoftext|>"], bos=None, unk="<|endoftext|>",
        image="<IMG_CONTEXT>", marker="<IMG_CONTEXT>", draft_vocab=144),
}
LAYOUTS["smolvlm"] = LAYOUTS["idefics3"]
_CHAT = (
    "{% for m in messages %}{{ m['role'] }} : "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}" + "MARKER" + " {% elif c['type'] == 'text' %}{{ c['text'] }} {% endif %}"
    "{% endfor %}{% endif %} {% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)


def vocab_of(family: str) -> dict[str, int]:
    """token -> id for ``family`` (text words fill the ids between the head and the tail tokens)."""
    from .testing import _WORDS

    lay = LAYOUTS[family]
    inner = lay.get("inner", {})  # special tokens inside the text vocabulary (Gemma's image markers)
    vocab = {t: i for i, t in enumerate(lay["head"])}
    free = [i for i in range(len(vocab), lay["tail_start"]) if i not in inner.values()]
    words = list(_WORDS)[:len(free)] + [f"w{i}" for i in range(max(0, len(free) - len(_WORDS)))]
    vocab.update(dict(zip(words, free)))
    vocab.update(inner)
    vocab.update({t: lay["tail_start"] + i for i, t in enumerate(lay["tail"])})
    return vocab


def ids_of(family: str) -> dict[str, Any]:
    """The ids the tests need: image, pad, bos, eos (list), the text vocabulary end and the natural draft's size."""
    lay, vocab = LAYOUTS[family], vocab_of(family)
    return dict(image=vocab[lay["image"]], pad=vocab[lay["pad"]], bos=vocab[lay["bos"]] if lay["bos"] else None,
                eos=[vocab[t] for t in lay["eos"]], text_end=lay["text_end"], vocab=lay["vocab"],
                draft_vocab=lay["draft_vocab"],
                reserved=[i for i in range(lay["tail_start"], lay["vocab"]) if i not in {vocab[t] for t in lay["eos"]}]
                + sorted(lay.get("inner", {}).values()))


def image_marker(family: str) -> str:
    return LAYOUTS[family]["marker"]


# ----------------------------------------------------------------------------------------------- models


def _llama_like(cls: type, family: str, **extra: Any) -> Any:
    ids = ids_of(family)
    return cls(vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
               initializer_range=_INIT_RANGE, bos_token_id=ids["bos"], eos_token_id=ids["eos"][0],
               pad_token_id=ids["pad"], tie_word_embeddings=False, **extra)


def _gemma3(seed: int) -> PreTrainedModel:
    ids = ids_of("gemma3")
    text = Gemma3TextConfig(
        vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=1024,
        initializer_range=_INIT_RANGE, sliding_window=16, attention_bias=True,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"], tie_word_embeddings=False)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=IMAGE_SIZE, patch_size=PATCH_SIZE)
    vocab = vocab_of("gemma3")
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=TOKENS_PER_TILE,
                       boi_token_index=vocab["<start_of_image>"], eoi_token_index=vocab["<end_of_image>"],
                       image_token_index=ids["image"], initializer_range=_INIT_RANGE, tie_word_embeddings=False)
    model = Gemma3ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
    with torch.no_grad():  # transformers initialises this projection to zeros: images would carry nothing
        proj = model.model.multi_modal_projector.mm_input_projection_weight
        proj.normal_(0.0, _INIT_RANGE)
        proj[:, _D] = 0.0
    return model


def _idefics(family: str) -> PreTrainedModel:
    ids = ids_of(family)
    text = _llama_like(LlamaConfig, family, attention_bias=True)
    vis_cls, cfg_cls, model_cls = ((Idefics3VisionConfig, Idefics3Config, Idefics3ForConditionalGeneration)
                                   if family == "idefics3" else
                                   (SmolVLMVisionConfig, SmolVLMConfig, SmolVLMForConditionalGeneration))
    vision = vis_cls(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, initializer_range=_INIT_RANGE)
    cfg = cfg_cls(text_config=text, vision_config=vision, scale_factor=2, image_token_id=ids["image"],
                  tie_word_embeddings=False, pad_token_id=ids["pad"])
    model = model_cls._from_config(cfg, attn_implementation="sdpa")
    with torch.no_grad():
        proj = model.model.connector.modality_projection.proj
        proj.weight[_D] = 0.0
    return model


def _internvl() -> PreTrainedModel:
    ids = ids_of("internvl")
    text = _llama_like(Qwen2Config, "internvl", use_sliding_window=False)
    vision = InternVLVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=[IMAGE_SIZE, IMAGE_SIZE], patch_size=[PATCH_SIZE, PATCH_SIZE],
                                  initializer_range=_INIT_RANGE)
    cfg = InternVLConfig(vision_config=vision, text_config=text, image_token_id=ids["image"],
                         image_seq_length=TOKENS_PER_TILE, downsample_ratio=0.5, vision_feature_layer=-1,
                         vision_feature_select_strategy="default", tie_word_embeddings=False)
    model = InternVLForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
    with torch.no_grad():
        proj = model.model.multi_modal_projector.linear_2
        proj.weight[_D] = 0.0
        proj.bias[_D] = 0.0
    return model


@torch.no_grad()
def _shape_gemma(decoder: torch.nn.Module, lm_head: torch.nn.Linear, text_end: int, reserved: list[int],
                 eos: list[int], eos_bias: float | None, gen: torch.Generator) -> None:
    """Gemma's post-norms rescale what a layer writes, so the bias channel is written by the last
    layer's attention alone (its other output channels zeroed: its post-norm then outputs a constant)
    and every other sub-layer's post-norm drops channel ``_D`` (Gemma norms scale by ``1 + weight``)."""
    from .testing import _BIAS_RATIO, _LOGIT_STD, _RESERVED_LOGIT

    decoder.embed_tokens.weight[:, _D] = 0.0
    for layer in decoder.layers:
        layer.post_attention_layernorm.weight[_D] = -1.0
        layer.post_feedforward_layernorm.weight[_D] = -1.0
    attn = decoder.layers[-1].self_attn
    attn.v_proj.weight[0] = 0.0
    attn.v_proj.bias[0] = 1.0
    attn.o_proj.weight.zero_()
    attn.o_proj.bias.zero_()
    attn.o_proj.weight[_D, 0] = 1.0
    seen: dict[str, torch.Tensor] = {}
    hook = decoder.norm.register_forward_hook(lambda mod, args, out: seen.update(x=args[0]))
    decoder(input_ids=torch.randint(6, text_end, (4, 48), generator=gen), use_cache=False)
    hook.remove()
    x = seen["x"]
    rest = torch.cat([x[..., :_D], x[..., _D + 1:]], dim=-1).norm(dim=-1).max().item()
    hidden = lm_head.weight.shape[1]
    decoder.layers[-1].post_attention_layernorm.weight[_D] = _BIAS_RATIO * rest / hidden ** 0.5 - 1.0
    h0 = hidden ** 0.5 * _BIAS_RATIO / (1 + _BIAS_RATIO ** 2) ** 0.5
    h_rest = hidden ** 0.5 / (1 + _BIAS_RATIO ** 2) ** 0.5
    scale = 1.0 + decoder.norm.weight  # Gemma's final norm
    w = lm_head.weight
    w.copy_(torch.randn(w.shape, generator=gen) * (_LOGIT_STD / h_rest) / scale)
    w[:, _D] = 0.0
    for r in reserved:
        w[r] = 0.0
        w[r, _D] = _RESERVED_LOGIT / h0 / scale[_D]
    if eos_bias is not None:
        for e in eos:
            w[e, _D] = eos_bias / h0 / scale[_D]


def build_target(family: str, seed: int, eos_bias: float | None) -> PreTrainedModel:
    """The tiny target of ``family`` (see the module docstring), float32, eval mode."""
    from .testing import _shape_lm, _language_model

    ids = ids_of(family)
    if family == "gemma3":
        model = _gemma3(seed)
    elif family == "internvl":
        model = _internvl()
    else:
        model = _idefics(family)
    gen = torch.Generator().manual_seed(seed + 1000)
    eos = ids["eos"]  # eos_bias applies to every EOS id
    decoder = _language_model(model)
    if family == "gemma3":
        _shape_gemma(decoder, model.lm_head, ids["text_end"], ids["reserved"], eos, eos_bias, gen)
    else:
        _shape_lm(decoder, model.lm_head, ids["vocab"], ids["reserved"], None, gen, probe_high=ids["text_end"])
        if eos_bias is not None:
            for e in eos:
                _eos_bias(decoder, model.lm_head, e, eos_bias)
    gc = model.generation_config
    gc.bos_token_id, gc.pad_token_id = ids["bos"], ids["pad"]
    gc.eos_token_id = ids["eos"] if len(ids["eos"]) > 1 else ids["eos"][0]
    return model.to(torch.float32).eval()


def _eos_bias(decoder: torch.nn.Module, lm_head: torch.nn.Linear, eos: int, eos_bias: float) -> None:
    from .testing import _BIAS_RATIO

    h0 = lm_head.weight.shape[1] ** 0.5 * _BIAS_RATIO / (1 + _BIAS_RATIO ** 2) ** 0.5
    with torch.no_grad():
        lm_head.weight[eos, _D] = eos_bias / h0


# ----------------------------------------------------------------------------------------------- processors


def _tokenizer(family: str) -> PreTrainedTokenizerFast:
    lay, vocab = LAYOUTS[family], vocab_of(family)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=lay["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = lay["head"] + list(lay.get("inner", {})) + lay["tail"]
    tok.add_special_tokens(sorted(specials, key=vocab.get))  # split out of unspaced image blocks
    if lay["bos"]:  # Gemma's tokenizer prepends <bos>
        tok.post_processor = processors.TemplateProcessing(single=f"{lay['bos']} $A",
                                                           special_tokens=[(lay["bos"], vocab[lay["bos"]])])
    extra = {}
    if family == "gemma3":
        extra = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    elif family == "internvl":
        extra = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                 "video_token": "<video>"}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=lay["bos"], eos_token=lay["eos"][0], unk_token=lay["unk"],
        pad_token=lay["pad"], padding_side="left", model_max_length=4096,
        chat_template=_CHAT.replace("MARKER", lay["marker"]), extra_special_tokens=extra)


class _NoVideo:
    """Mixin: the family's processor without its video processor (which needs torchvision)."""

    def check_argument_for_proper_class(self, argument_name: str, argument: object) -> type | None:
        if argument is None and argument_name == "video_processor":
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


class TinySmolVLMProcessor(_NoVideo, SmolVLMProcessor):
    """``SmolVLMProcessor`` accepting ``video_processor=None`` (images and text only).

    The real processor refuses to start without the ``num2words`` package, which only its video prompts
    use; with no video processor here, a stand-in that raises lets it start where that package is absent.
    """

    def __init__(self, image_processor: Any, tokenizer: Any, video_processor: Any = None, image_seq_len: int = 169,
                 chat_template: str | None = None, **kwargs: Any):
        from transformers.models.smolvlm import processing_smolvlm as module

        args = (image_processor, tokenizer, video_processor, image_seq_len, chat_template)
        if module.num2words is not None:
            super().__init__(*args, **kwargs)
            return
        module.num2words = _no_num2words
        try:
            super().__init__(*args, **kwargs)
        finally:
            module.num2words = None


def _no_num2words(n: int) -> str:
    raise RuntimeError("video prompts need the num2words package")


class TinyInternVLProcessor(_NoVideo, InternVLProcessor):
    """``InternVLProcessor`` accepting ``video_processor=None`` (images and text only)."""


def build_processor(family: str) -> ProcessorMixin:
    tok = _tokenizer(family)
    chat = tok.chat_template
    if family == "gemma3":
        ip = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
        return Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=TOKENS_PER_TILE, chat_template=chat)
    if family in ("idefics3", "smolvlm"):
        kw = dict(size={"longest_edge": 2 * IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE},
                  do_image_splitting=True)
        if family == "idefics3":
            return Idefics3Processor(image_processor=Idefics3ImageProcessorPil(**kw), tokenizer=tok,
                                     image_seq_len=TOKENS_PER_TILE, chat_template=chat)
        return TinySmolVLMProcessor(image_processor=SmolVLMImageProcessorPil(**kw), tokenizer=tok,
                                    video_processor=None, image_seq_len=TOKENS_PER_TILE, chat_template=chat)
    ip = GotOcr2ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, crop_to_patches=True,
                                  min_patches=1, max_patches=4)
    return TinyInternVLProcessor(image_processor=ip, tokenizer=tok, video_processor=None,
                                 image_seq_length=TOKENS_PER_TILE, chat_template=chat)


# ----------------------------------------------------------------------------------------------- drafts


def natural_text_draft(target: PreTrainedModel, noise: float = 0.0, seed: int = 7) -> PreTrainedModel:
    """The target's LM as a text-only ``*ForCausalLM`` with the natural draft's vocabulary size: cut to the
    text ids (gemma-3-1b's 262144, SmolLM2's 49152) or grown past the target's rows (Qwen2.5's 151936 for
    InternVL). Grown rows get a logit far above every other (a draft that would propose ids the target
    does not have, if it could). ``noise``: relative Gaussian noise on the LM head (a draft that agrees
    often, not always)."""
    from .targets import target_family
    from .testing import _BIAS_RATIO, text_draft_from_target

    size = ids_of(target_family(target).name)["draft_vocab"]
    draft = text_draft_from_target(target)
    old = draft.get_output_embeddings().weight.shape[0]
    draft.resize_token_embeddings(size, mean_resizing=False)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = draft.get_output_embeddings().weight
        if size > old:
            head[old:] = 0.0
            h0 = head.shape[1] ** 0.5 * _BIAS_RATIO / (1 + _BIAS_RATIO ** 2) ** 0.5  # bias channel after the norm
            head[old:, _D] = 30.0 / h0  # logit ~ +30: always the draft's favourite, were it proposable
            draft.get_input_embeddings().weight[old:] = 0.0
        if noise:
            head.add_(noise * head[: min(old, size)].std() * torch.randn(head.shape, generator=gen))
    return draft.eval()
