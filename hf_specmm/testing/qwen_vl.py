"""Tiny offline Qwen-VL fixtures (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE): real classes, the real token layout
scaled down, built from configs with random weights (registered as fixture families: see :mod:`hf_specmm.testing`).

Id layout, as upstream (Qwen2.5-VL-7B: 151,643 BPE ids, the specials from 151,643, a 151,665-token
tokenizer, a 151,936-row Qwen2.5-0.5B draft and a 152,064-row target), scaled down:

* ``0 .. 99`` words (``0 .. 2`` as Qwen's ``!"#``, ``0`` the word-level unknown; ``3 ..`` the LLaVA
  fixtures' words at the LLaVA fixtures' ids);
* ``100`` ``<|endoftext|>`` (pad), ``101`` ``<|im_start|>``, ``102`` ``<|im_end|>`` (EOS), ``103 .. 108``
  object/box/quad markers, ``109`` ``<|vision_start|>``, ``110`` ``<|vision_end|>``, ``111``
  ``<|vision_pad|>``, ``112`` ``<|image_pad|>``, ``113`` ``<|video_pad|>``, ``114 .. 119`` tool markers;
* config vocab padded beyond the 120-token tokenizer: :data:`DRAFT_VOCAB` = 128 rows for the natural
  text draft (Qwen2.5-0.5B / Qwen3-0.6B shape) and 136 for Qwen2-VL / Qwen2.5-VL targets (152,064 vs
  151,936 upstream), 128 for Qwen3-VL and Qwen3-VL-MoE (151,936 = Qwen3-0.6B's).

Qwen3-VL-MoE: every text layer is a sparse MoE block (4 experts, 2 per token; Qwen3-VL-30B-A3B: 128, 8);
its exact text copy is a ``Qwen3MoeForCausalLM``, its natural and random text drafts dense ``Qwen3ForCausalLM``
(Qwen3-0.6B).

The target's LM is shaped like the LLaVA fixtures' (:func:`~hf_specmm.testing.shaping.shape_lm`): vision
markers, pads and the rows beyond the tokenizer get a logit of about -20, so random generations never emit
them.
"""

from __future__ import annotations

from typing import Callable

import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    BatchFeature,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2Config,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLProcessor,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
    Qwen3VLProcessor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from .registry import FixtureFamily, register_fixture
from .shaping import WORDS, finish, shape_lm

QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
N_WORDS = 100
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
             "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
             "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
             "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>"]
IDS = {name: N_WORDS + i for i, name in enumerate(_SPECIALS)}
PAD_ID, EOS_ID = IDS["<|endoftext|>"], IDS["<|im_end|>"]
IMAGE_ID, VIDEO_ID = IDS["<|image_pad|>"], IDS["<|video_pad|>"]
VISION_START_ID, VISION_END_ID = IDS["<|vision_start|>"], IDS["<|vision_end|>"]
TOKENIZER_SIZE = N_WORDS + len(_SPECIALS)  # 120
DRAFT_VOCAB = 128  # the natural text draft's rows (Qwen2.5-0.5B: 151936)
# 152064 / 152064 / 151936 / 151936 upstream
TARGET_VOCAB = {"qwen2_vl": 136, "qwen2_5_vl": 136, "qwen3_vl": 128, "qwen3_vl_moe": 128}
# image features scaled down where at full scale they decide every token (a text-only copy of the LM, blind to
# the image, would then never agree with the target, while real VLMs' answers follow the text too)
IMAGE_SCALE = {"qwen3_vl_moe": 0.1}
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
PATCH, MERGE, TEMPORAL = 4, 2, 2  # 32x32 image -> 8x8 patches -> 4x4 = 16 placeholder tokens
HIDDEN, HEADS, HEAD_DIM = 64, 4, 16
MROPE_SECTION = [2, 3, 3]  # sums to HEAD_DIM / 2 (upstream [16, 24, 24] of 64; Qwen3-VL [24, 20, 20])
EOS_OFFSET = 2.0  # added to tiny_target's eos_bias: eos_bias=2 stops most rows early, as for the LLaVA fixtures
EOS_OFFSETS = {"qwen3_vl_moe": 0.5}  # measured: with 2.0 every row of the MoE fixture stops at the first free step
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
_CLASSES = {"qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor),
            "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor),
            "qwen3_vl": (Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor),
            "qwen3_vl_moe": (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration, Qwen3VLProcessor)}


def reserved_ids(vocab_size: int) -> list[int]:
    """Ids a real Qwen never writes: vision markers and pads, and the rows beyond the tokenizer."""
    marks = [IDS[t] for t in ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")]
    return marks + list(range(TOKENIZER_SIZE, vocab_size))


def _config(family: str, vocab: int) -> PretrainedConfig:
    text = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                num_attention_heads=HEADS, num_key_value_heads=HEADS // 2, max_position_embeddings=1024,
                initializer_range=0.2, bos_token_id=PAD_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE_SECTION})
    vision: dict = dict(depth=2, num_heads=4, patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL)
    if family == "qwen2_vl":
        vision.update(embed_dim=32, hidden_size=HIDDEN, mlp_ratio=2)
    elif family == "qwen2_5_vl":
        vision.update(hidden_size=32, intermediate_size=64, out_hidden_size=HIDDEN, window_size=2 * PATCH * MERGE,
                      fullatt_block_indexes=[1], tokens_per_second=2)
    else:  # Qwen3-VL, Qwen3-VL-MoE
        text.update(head_dim=HEAD_DIM, attention_bias=True)  # value bias: the bias channel of shape_lm
        text["rope_parameters"]["mrope_interleaved"] = True
        vision.update(hidden_size=32, intermediate_size=64, out_hidden_size=HIDDEN, num_position_embeddings=64,
                      deepstack_visual_indexes=[0])
        if family == "qwen3_vl_moe":
            text.update(MOE)
    cls = _CLASSES[family][0]
    return cls(text_config=text, vision_config=vision, image_token_id=IMAGE_ID, video_token_id=VIDEO_ID,
               vision_start_token_id=VISION_START_ID, vision_end_token_id=VISION_END_ID, tie_word_embeddings=False,
               pad_token_id=PAD_ID)


def build_target(family: str, seed: int, eos_bias: float | None) -> PreTrainedModel:
    """The tiny target (called by ``testing.tiny_target`` inside its seeded RNG fork)."""
    vocab = TARGET_VOCAB[family]
    model = _CLASSES[family][1]._from_config(_config(family, vocab), attn_implementation="sdpa")
    with torch.no_grad():  # image features carry nothing in the LM's bias channel (see shaping.shape_lm)
        visual = model.model.visual
        mergers = [visual.merger] + list(getattr(visual, "deepstack_merger_list", []))
        for merger in mergers:
            last = [m for m in merger.modules() if isinstance(m, torch.nn.Linear)][-1]
            last.weight[0] = 0.0
            last.bias[0] = 0.0
            if family in IMAGE_SCALE:
                last.weight.mul_(IMAGE_SCALE[family])
                last.bias.mul_(IMAGE_SCALE[family])
    gen = torch.Generator().manual_seed(seed + 1000)
    shape_lm(model.model.language_model, model.lm_head, vocab, reserved_ids(vocab),
             None if eos_bias is None else eos_bias + EOS_OFFSETS.get(family, EOS_OFFSET), gen, eos_id=EOS_ID)
    if eos_bias is not None:  # EOS's logit is the bias alone (a random part can keep it low for a whole run)
        with torch.no_grad():
            keep = model.lm_head.weight[EOS_ID, 0].clone()
            model.lm_head.weight[EOS_ID] = 0.0
            model.lm_head.weight[EOS_ID, 0] = keep
    return finish(model, PAD_ID, EOS_ID, bos_id=None)


def text_config(text: PretrainedConfig, vocab: int | None = None, dense: bool = False, **overrides) -> PretrainedConfig:
    """The plain causal-LM config (Qwen2 / Qwen3 / Qwen3-MoE) equal to a Qwen-VL target's text config ``text``
    (``dense``: a Qwen3 of the same shape without the experts, as Qwen3-0.6B for Qwen3-VL-MoE)."""
    fields = {k: getattr(text, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                                            "rms_norm_eps", "hidden_act", "initializer_range", "bos_token_id",
                                            "eos_token_id", "pad_token_id")
              if k not in overrides}  # an override of a field the text config lacks (Qwen3.5-MoE's MLP width)
    fields["vocab_size"] = vocab or text.vocab_size
    fields["rope_parameters"] = {"rope_type": "default", "rope_theta": text.rope_parameters["rope_theta"]}
    fields["tie_word_embeddings"] = False
    if text.model_type.startswith("qwen3"):
        fields.update(head_dim=text.head_dim, attention_bias=text.attention_bias)
        if getattr(text, "num_experts", 0) and not dense:  # Qwen3-VL-MoE's router renormalises its top-k
            fields.update({k: getattr(text, k) for k in (*MOE, "mlp_only_layers")}, norm_topk_prob=True)
            return Qwen3MoeConfig(**{**fields, **overrides})
        return Qwen3Config(**{**fields, **overrides})
    return Qwen2Config(use_sliding_window=False, **{**fields, **overrides})


def random_text_draft(target: PreTrainedModel, seed: int, vocab_size: int | None,
                      eos_bias: float | None) -> PreTrainedModel:
    """A different random 1-layer / hidden-32 Qwen2 / Qwen3 LM (default: :data:`DRAFT_VOCAB` rows)."""
    text = target.config.text_config
    fields = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2)
    if text.model_type.startswith("qwen3"):
        fields.update(head_dim=8, attention_bias=True)
    base = text_config(text, vocab_size or DRAFT_VOCAB, dense=True, **fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = AutoModelForCausalLM.from_config(base, attn_implementation="sdpa")
        gen = torch.Generator().manual_seed(seed + 1000)
        shape_lm(draft.model, draft.lm_head, base.vocab_size, reserved_ids(base.vocab_size), eos_bias, gen, eos_id=EOS_ID)
    return finish(draft, PAD_ID, EOS_ID, bos_id=None)


class _NoVideoProcessorMixin:
    """The Qwen video processors need torchvision; images and text work without one (videos: see
    :func:`make_inputs`, which builds video tensors directly)."""

    def check_argument_for_proper_class(self, argument_name: str, argument: object) -> type | None:
        if argument is None and argument_name == "video_processor":
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


class TinyQwen2VLProcessor(_NoVideoProcessorMixin, Qwen2VLProcessor):
    pass


class TinyQwen2_5_VLProcessor(_NoVideoProcessorMixin, Qwen2_5_VLProcessor):
    pass


class TinyQwen3VLProcessor(_NoVideoProcessorMixin, Qwen3VLProcessor):
    pass


_TINY_PROCESSORS = {"qwen2_vl": TinyQwen2VLProcessor, "qwen2_5_vl": TinyQwen2_5_VLProcessor,
                    "qwen3_vl": TinyQwen3VLProcessor, "qwen3_vl_moe": TinyQwen3VLProcessor}


def tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(words[:N_WORDS])}
    vocab.update(IDS)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(_SPECIALS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=words[0], padding_side="left", model_max_length=4096,
                                   chat_template=CHAT_TEMPLATE)


def processor(family: str, words: list[str]) -> ProcessorMixin:
    """The real Qwen processor class (no video processor) with the PIL image processor."""
    image = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL,
                                     min_pixels=(PATCH * MERGE) ** 2, max_pixels=64 * 64)
    return _TINY_PROCESSORS[family](image_processor=image, tokenizer=tokenizer(words), video_processor=None,
                                    chat_template=CHAT_TEMPLATE)


def video_inputs(family: str, frames: int, size: tuple[int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """One video built directly as tensors (the video processors need torchvision): ``pixel_values_videos``
    [t·h·w patches, 3·T·P·P], its ``video_grid_thw`` [1, 3] and the placeholder text the processor writes
    (Qwen3-VL: a timestamp word and a vision span per frame group)."""
    w, h = size
    t, gh, gw = frames // TEMPORAL, h // PATCH, w // PATCH
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(t * gh * gw, 3 * TEMPORAL * PATCH * PATCH, generator=gen)
    per_frame = gh * gw // MERGE ** 2
    if family.startswith("qwen3_vl"):
        span = " ".join(f"w{i} <|vision_start|>" + "<|video_pad|>" * per_frame + "<|vision_end|>" for i in range(t))
    else:
        span = "<|vision_start|>" + "<|video_pad|>" * (t * per_frame) + "<|vision_end|>"
    return pixels, torch.tensor([[t, gh, gw]]), span


def make_inputs(family: str, proc: ProcessorMixin, prompts: list[str], images: list, videos: list | None = None,
                padding_side: str = "left") -> BatchFeature:
    """Row ``i``: ``images[i]`` (None, an image or a list of images) and ``videos[i]`` (None or
    ``(frames, (w, h), seed)``) before the prompt, in a one-turn chat (unless the prompt is one already;
    a prompt that places its images itself, with ``<|image_pad|>`` or LLaVA's ``<image>``, keeps them there)."""
    out = chat_inputs(proc, prompts, images, videos, padding_side, "<|vision_start|><|image_pad|><|vision_end|>",
                      lambda video: video_inputs(family, *video), lambda count: "<|image_pad|>" * count)
    if "pixel_values_videos" in out:  # tokenized here, not by the processor: mark the token types
        ids = out["input_ids"]
        out["mm_token_type_ids"] = (ids == IMAGE_ID).long() + 2 * (ids == VIDEO_ID).long()
    return out


def chat_inputs(proc: ProcessorMixin, prompts: list[str], images: list, videos: list | None, padding_side: str,
                image_span: str, video: Callable[[tuple], tuple[torch.Tensor, torch.Tensor, str]],
                expand: Callable[[int], str]) -> BatchFeature:
    """One-turn chats over the Qwen chat layout (shared with :mod:`~hf_specmm.testing.ovis_onevision`): each
    image written as ``image_span`` (holding one ``<|image_pad|>``), each video as ``video(spec)`` builds it
    (patches, grid, its text already expanded). With videos (no video processor) each image's pad becomes
    ``expand(placeholders)``, as the processor would write it, and the text is tokenized here."""
    videos = videos or [None] * len(prompts)
    texts, flat, pixel_videos, grids = [], [], [], []
    for prompt, imgs, clip in zip(prompts, images, videos):
        imgs = [] if imgs is None else [imgs] if isinstance(imgs, Image.Image) else list(imgs)
        flat.extend(imgs)
        # a LLaVA-style "<image>" in the prompt is where that image's vision span goes
        prompt = prompt.replace("<image>", image_span)
        spans = image_span * len(imgs) if "<|image_pad|>" not in prompt else ""
        if clip is not None:
            pixels, grid, span = video(clip)
            pixel_videos.append(pixels)
            grids.append(grid)
            spans += span
        texts.append(prompt if "<|im_start|>" in prompt else
                     f"<|im_start|>user {spans}{prompt} <|im_end|> <|im_start|>assistant")
    proc.tokenizer.padding_side = padding_side
    if not pixel_videos:
        return proc(images=flat or None, text=texts, padding=True, return_tensors="pt")
    out = BatchFeature(dict(proc.image_processor(images=flat, return_tensors="pt"))) if flat else BatchFeature({})
    counts = iter((out["image_grid_thw"].prod(-1) // MERGE ** 2).tolist() if flat else [])
    texts = ["".join(part if i == 0 else expand(next(counts)) + part
                     for i, part in enumerate(text.split("<|image_pad|>"))) for text in texts]
    out.update(proc.tokenizer(texts, padding=True, return_tensors="pt"))
    out["pixel_values_videos"] = torch.cat(pixel_videos)
    out["video_grid_thw"] = torch.cat(grids)
    return out


class QwenVLFixtures(FixtureFamily):
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3-VL-MoE: their own fixed id layout (``vocab_size`` is ignored)."""

    group = "qwen_vl"
    image_marker = "<|image_pad|>"

    def __init__(self, name: str):
        self.name = name

    def target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
        return build_target(self.name, seed, eos_bias)

    def processor(self, vocab_size: int) -> ProcessorMixin:
        return processor(self.name, ["!", '"', "#"] + list(WORDS) + [f"w{i}" for i in range(N_WORDS)])

    def ids(self, vocab_size: int) -> dict:
        return {"eos": [EOS_ID], "pad": PAD_ID, "bos": None, "image": IMAGE_ID, "video": VIDEO_ID,
                "vision_start": VISION_START_ID, "vision_end": VISION_END_ID}

    def natural_draft_vocab(self, target: PreTrainedModel) -> int:
        return DRAFT_VOCAB

    def causal_lm_config(self, target: PreTrainedModel) -> PretrainedConfig:
        return text_config(target.config.text_config)  # Qwen-VL text configs have no causal-LM class of their own

    def random_draft(self, target: PreTrainedModel, seed: int, vocab_size: int | None,
                     eos_bias: float | None) -> PreTrainedModel:
        return random_text_draft(target, seed, vocab_size, eos_bias)

    def inputs(self, processor: ProcessorMixin, prompts: list[str], images: list, videos: list | None,
               padding_side: str) -> BatchFeature:
        return make_inputs(self.name, processor, prompts, images, videos, padding_side)


for _name in QWEN_FAMILIES:
    register_fixture(QwenVLFixtures(_name))
