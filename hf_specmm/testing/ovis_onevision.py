"""Tiny LLaVA-OneVision-1.5 and Ovis2.5 fixtures (``llava_onevision1_5``, ``ovis2_5``; transformers >= 5.25
only: on older versions this module registers nothing).

Both are a Qwen3 LM over the Qwen token layout with a native-resolution vision tower (patches and
``image_grid_thw``, merged 2x2), so the ids are the Qwen-VL fixtures' (:mod:`~hf_specmm.testing.qwen_vl`:
``109 <|vision_start|> 110 <|vision_end|> 112 <|image_pad|> 113 <|video_pad|>``, EOS ``<|im_end|>``,
pad ``<|endoftext|>``), 128 rows as Qwen3's 151936 (the natural text draft, a Qwen3 LM, has them all).

- LLaVA-OneVision-1.5: its chat template writes ``<|vision_start|><|image_pad|><|vision_end|>`` per image and
  its processor (``Exaone4_5_Processor`` upstream) expands the pad; 1-D positions as plain ``generate``'s.
- Ovis2.5: its chat template writes one ``<|image_pad|>`` per image and its processor adds the boundary
  tokens around the expanded pads (upstream 151670-151673 past the Qwen3 tokenizer's 151669 entries; here
  ``120 <ovis_image_start> 121 <ovis_image_end> 122 <ovis_video_start> 123 <ovis_video_end>``, named for
  the fixture), whose embeddings the model replaces with learned indicator features.

Images keep their size within a 64x64 budget (4-px patches, temporal patch 1): a 32x32 image is 16
placeholders, a 64x32 one 32. Videos are built as tensors (the video processors need torchvision): ``t``
frames of ``(w, h)`` are ``t·h·w / 64`` placeholders in one span.
"""

from __future__ import annotations

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import BatchFeature, PreTrainedModel, PreTrainedTokenizerFast, ProcessorMixin, Qwen3Config

from .layouts import NoVideo
from .qwen_vl import IDS, N_WORDS, QwenVLFixtures, chat_inputs, reserved_ids
from .registry import register_fixture
from .shaping import WORDS, finish, shape_lm

PATCH, MERGE = 4, 2  # temporal patch 1: a 32x32 image -> 8x8 patches -> 16 placeholders
VOCAB = 128  # Qwen3's 151936 rows
OVIS_MARKERS = ["<ovis_image_start>", "<ovis_image_end>", "<ovis_video_start>", "<ovis_video_end>"]
OVIS_IDS = {name: len(IDS) + N_WORDS + i for i, name in enumerate(OVIS_MARKERS)}  # 120..123
IMAGE, VIDEO = IDS["<|image_pad|>"], IDS["<|video_pad|>"]
PAD_ID, EOS_ID = IDS["<|endoftext|>"], IDS["<|im_end|>"]
EOS_OFFSET = 2.0  # added to tiny_target's eos_bias, as for the Qwen-VL fixtures
# image features scaled down, as the Qwen3-VL-MoE fixture's: at full scale they decide nearly every token of an
# image row (LLaVA-OneVision-1.5's exact text copy, blind to the image, was accepted at 0.00 on the tests' one
# image row; 0.06 scaled), while real VLMs' answers follow the text too
IMAGE_SCALE = 0.1

_ONEVISION_SPAN = "<|vision_start|>{}<|vision_end|>"  # the chat template writes the markers
_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} "
             "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
             "{% if c['type'] == 'image' %}IMAGE{% elif c['type'] == 'video' %}VIDEO"
             "{% elif c['type'] == 'text' %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}<|im_end|> {% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def text_config(**extra) -> Qwen3Config:
    """The 2-layer Qwen3 text config of both targets (value bias on: the bias channel of ``shape_lm``)."""
    return Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
                       max_position_embeddings=1024, initializer_range=0.2, bos_token_id=PAD_ID, eos_token_id=EOS_ID,
                       pad_token_id=PAD_ID, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **extra)


def tokenizer(image_span: str, video_span: str, extra: dict[str, int] | None = None,
              named: dict[str, str] | None = None) -> PreTrainedTokenizerFast:
    """The Qwen-VL fixtures' word-level vocabulary (plus ``extra`` specials), a chat template writing
    ``image_span`` / ``video_span`` per image / video, ``named`` tokens as the processor reads them."""
    vocab = {w: i for i, w in enumerate((["!", '"', "#"] + list(WORDS) + [f"w{i}" for i in range(N_WORDS)])[:N_WORDS])}
    specials = {**IDS, **(extra or {})}
    vocab.update(specials)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="!"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    template = _TEMPLATE.replace("IMAGE", image_span).replace("VIDEO", video_span)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="!", padding_side="left", model_max_length=4096,
                                   chat_template=template, extra_special_tokens=named or {})


def _video(frames: int, size: tuple[int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Patches [t·gh·gw, 3·P·P], ``video_grid_thw`` [1, 3] and the placeholder count of one video."""
    w, h = size
    gh, gw = h // PATCH, w // PATCH
    pixels = torch.randn(frames * gh * gw, 3 * PATCH * PATCH, generator=torch.Generator().manual_seed(seed))
    return pixels, torch.tensor([[frames, gh, gw]]), frames * gh * gw // MERGE ** 2


class _Qwen3VisionFixtures(QwenVLFixtures):
    """Shared by both families: the Qwen-VL fixtures' tokenizer ids, drafts and text config, another model
    and processor, prompts wrapped in a one-turn chat with the family's spans."""

    image_span = ""  # what a prompt holds per image before the processor expands it
    video_open = video_close = ""  # what the processor writes around a video's pads

    def model(self) -> PreTrainedModel:
        raise NotImplementedError

    def feature_projections(self, model: PreTrainedModel) -> list[torch.Tensor]:
        """The last weights (and bias) writing the image features: output row 0 is the LM's bias channel."""
        raise NotImplementedError

    def target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
        model = self.model()
        with torch.no_grad():  # image features carry nothing in the LM's bias channel (see shaping.shape_lm)
            for weight in self.feature_projections(model):
                weight[0] = 0.0
                weight.mul_(IMAGE_SCALE)
        gen = torch.Generator().manual_seed(seed + 1000)
        reserved = reserved_ids(VOCAB) + list(self.extra_ids().values())
        shape_lm(model.model.language_model, model.lm_head, VOCAB, reserved,
                 None if eos_bias is None else eos_bias + EOS_OFFSET, gen, eos_id=EOS_ID)
        if eos_bias is not None:  # EOS's logit is the bias alone, as for the Qwen-VL fixtures
            with torch.no_grad():
                keep = model.lm_head.weight[EOS_ID, 0].clone()
                model.lm_head.weight[EOS_ID] = 0.0
                model.lm_head.weight[EOS_ID, 0] = keep
        return finish(model, PAD_ID, EOS_ID, bos_id=None)

    def extra_ids(self) -> dict[str, int]:
        return {}

    def ids(self, vocab_size: int) -> dict:
        return {"eos": [EOS_ID], "pad": PAD_ID, "bos": None, "image": IMAGE, "video": VIDEO, **self.extra_ids()}

    def inputs(self, processor: ProcessorMixin, prompts: list[str], images: list, videos: list | None,
               padding_side: str) -> BatchFeature:
        """Row ``i``: ``images[i]`` (None, an image or a list) and ``videos[i]`` (None or ``(frames, (w, h), seed)``)
        before the prompt in a one-turn chat (see :func:`~hf_specmm.testing.qwen_vl.chat_inputs`)."""
        return chat_inputs(processor, prompts, images, videos, padding_side, self.image_span, self.video, self.expand)

    def video(self, spec: tuple) -> tuple[torch.Tensor, torch.Tensor, str]:
        """One video's patches, ``video_grid_thw`` and text, written expanded (no video processor here)."""
        pixels, grid, count = _video(*spec)
        return pixels, grid, self.video_open + "<|video_pad|>" * count + self.video_close

    def expand(self, count: int) -> str:
        """The processor's text for one image of ``count`` placeholders (where the prompt had one pad)."""
        return "<|image_pad|>" * count


class OnevisionFixtures(_Qwen3VisionFixtures):
    group = "llava_onevision1_5"
    image_span = _ONEVISION_SPAN.format("<|image_pad|>")
    video_open, video_close = "<|vision_start|>", "<|vision_end|>"

    def model(self) -> PreTrainedModel:
        vision = LlavaOnevision15VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                                              patch_size=PATCH, spatial_merge_size=MERGE, out_hidden_size=64,
                                              initializer_range=0.2)
        cfg = LlavaOnevision15Config(text_config=text_config(), vision_config=vision, image_token_id=IMAGE,
                                     video_token_id=VIDEO, vision_start_token_id=IDS["<|vision_start|>"],
                                     vision_end_token_id=IDS["<|vision_end|>"], tie_word_embeddings=False)
        return LlavaOnevision15ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")

    def ids(self, vocab_size: int) -> dict:
        return {**super().ids(vocab_size), "vision_start": IDS["<|vision_start|>"], "vision_end": IDS["<|vision_end|>"]}

    def feature_projections(self, model: PreTrainedModel) -> list[torch.Tensor]:
        last = model.model.visual.merger.linear_fc2
        return [last.weight.data, last.bias.data]

    def processor(self, vocab_size: int) -> ProcessorMixin:
        image = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=1,
                                         min_pixels=(PATCH * MERGE) ** 2, max_pixels=64 * 64)
        tok = tokenizer(self.image_span, _ONEVISION_SPAN.format("<|video_pad|>"))
        return TinyOnevision15Processor(image_processor=image, tokenizer=tok, video_processor=None,
                                        chat_template=tok.chat_template)


class OvisFixtures(_Qwen3VisionFixtures):
    group = "ovis2_5"
    image_span = "<|image_pad|>"  # the processor writes the boundary tokens
    video_open, video_close = "<ovis_video_start>", "<ovis_video_end>"

    def extra_ids(self) -> dict[str, int]:
        return dict(zip(("image_start", "image_end", "video_start", "video_end"), OVIS_IDS.values()))

    def model(self) -> PreTrainedModel:
        vision = Ovis2_5VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     patch_size=PATCH, spatial_merge_size=MERGE, image_size=32,
                                     window_size=4 * PATCH * MERGE, layer_types=["window_attention", "full_attention"],
                                     vocab_size=64, num_visual_indicator_tokens=4, initializer_range=0.2)
        ids = self.extra_ids()
        cfg = Ovis2_5Config(text_config=text_config(), vision_config=vision, image_token_id=IMAGE,
                            video_token_id=VIDEO, image_start_token_id=ids["image_start"],
                            image_end_token_id=ids["image_end"], video_start_token_id=ids["video_start"],
                            video_end_token_id=ids["video_end"], tie_word_embeddings=False)
        return Ovis2_5ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")

    def feature_projections(self, model: PreTrainedModel) -> list[torch.Tensor]:
        return [model.model.multi_modal_projector.visual_embeddings_table.weight.data]  # the indicators' too

    def processor(self, vocab_size: int) -> ProcessorMixin:
        image = Ovis2_5ImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=1,
                                         size={"shortest_edge": (PATCH * MERGE) ** 2, "longest_edge": 64 * 64})
        names = dict(zip(("image_start_token", "image_end_token", "video_start_token", "video_end_token"),
                         OVIS_MARKERS), image_token="<|image_pad|>", video_token="<|video_pad|>")
        tok = tokenizer(self.image_span, "<|video_pad|>", OVIS_IDS, names)
        return TinyOvis2_5Processor(image_processor=image, tokenizer=tok, video_processor=None,
                                    chat_template=tok.chat_template)

    def expand(self, count: int) -> str:
        return "<ovis_image_start>" + "<|image_pad|>" * count + "<ovis_image_end>"


if hasattr(transformers, "LlavaOnevision15ForConditionalGeneration"):
    from transformers import LlavaOnevision15Config, LlavaOnevision15ForConditionalGeneration
    from transformers.models.exaone4_5.processing_exaone4_5 import Exaone4_5_Processor
    from transformers.models.llava_onevision1_5.configuration_llava_onevision1_5 import LlavaOnevision15VisionConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class TinyOnevision15Processor(NoVideo, Exaone4_5_Processor):
        """LLaVA-OneVision-1.5's processor class without its video processor (torchvision)."""

    ONEVISION1_5 = register_fixture(OnevisionFixtures("llava_onevision1_5"))

if hasattr(transformers, "Ovis2_5ForConditionalGeneration"):
    from transformers import Ovis2_5Config, Ovis2_5ForConditionalGeneration, Ovis2_5Processor
    from transformers.models.ovis2_5.configuration_ovis2_5 import Ovis2_5VisionConfig
    from transformers.models.ovis2_5.image_processing_pil_ovis2_5 import Ovis2_5ImageProcessorPil

    class TinyOvis2_5Processor(NoVideo, Ovis2_5Processor):
        """Ovis2.5's processor without its video processor (torchvision)."""

    OVIS2_5 = register_fixture(OvisFixtures("ovis2_5"))
