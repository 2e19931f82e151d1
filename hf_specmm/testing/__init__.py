"""Tiny, fast, deterministic offline fixtures for tests, examples, benchmarks and doctests (no Hub access).

Shipped as ``torch.testing`` is, and kept out of the core: nothing outside ``hf_specmm.testing``,
``hf_specmm.bench`` and the world demo imports it. Up to eighteen target families are covered, each registered by a
module of this package (:mod:`~hf_specmm.testing.registry`): LLaVA-1.5 / NeXT / OneVision
(:mod:`~hf_specmm.testing.llava`), Qwen2-VL / Qwen2.5-VL / Qwen3-VL (:mod:`~hf_specmm.testing.qwen_vl`),
Gemma 3 (:mod:`~hf_specmm.testing.gemma3`), Idefics3 / SmolVLM (:mod:`~hf_specmm.testing.idefics3`) and
InternVL (:mod:`~hf_specmm.testing.internvl`), Qwen3-VL-MoE, Muse Glimmer (:mod:`~hf_specmm.testing.muse_glimmer`);
on transformers >= 5.24 also Gemma 4 and Gemma 4 Unified (:mod:`~hf_specmm.testing.gemma4`), on >= 5.25
LLaVA-OneVision-1.5 and Ovis2.5 (:mod:`~hf_specmm.testing.ovis_onevision`), Step3.7
(:mod:`~hf_specmm.testing.step3p7`); Qwen3.5
(:mod:`~hf_specmm.testing.qwen3_5`, a hybrid with linear-attention layers, outside :data:`FAMILIES`: its own
suite). Every model is built from configs with random weights and shaped LM heads
(:mod:`~hf_specmm.testing.shaping`); every processor is the family's real transformers processor over an
in-memory ``tokenizers`` WordLevel vocabulary and a PIL image processor (no torchvision).

    >>> import hf_specmm
    >>> from hf_specmm import testing
    >>> model = hf_specmm.enable(testing.tiny_target("llava", eos_bias=-30.0))
    >>> inputs = testing.make_inputs("llava", testing.tiny_processor("llava"), ["describe the image", "hi"],
    ...                              [testing.tiny_image(0), None])
    >>> exact = testing.text_draft_from_target(model)  # the target's LM: it reads the text, not the image
    >>> out = model.generate(**inputs, assistant_model=exact, max_new_tokens=8)
    >>> hf_specmm.last_stats(model).acceptance_rate < 1.0  # the row with an image: the draft cannot see it
    True
    >>> text = testing.make_inputs("llava", testing.tiny_processor("llava"), ["describe the image"], [None])
    >>> out = model.generate(**text, assistant_model=exact, max_new_tokens=8)
    >>> hf_specmm.last_stats(model).acceptance_rate  # on text it is the target: every draft accepted
    1.0
"""

from __future__ import annotations

from typing import Any

import numpy as np
import transformers
from PIL import Image
from transformers import BatchFeature, PreTrainedModel, ProcessorMixin

# isort: off
# each module registers its families; this order is FAMILIES' order
from . import llava, qwen_vl  # noqa: F401
from . import gemma3, idefics3, internvl  # noqa: F401
if hasattr(transformers, "MuseGlimmerForConditionalGeneration"):  # registered only where transformers has it
    from . import muse_glimmer  # noqa: F401
from . import gemma4  # noqa: F401  (registers nothing before transformers 5.24)
from . import qwen3_5  # noqa: F401  (where transformers has Qwen3.5)
from . import ovis_onevision  # noqa: F401  (registers nothing before transformers 5.25)
from . import step3p7  # noqa: F401  (registers nothing before transformers 5.25)
from . import inkling  # noqa: F401  (registers nothing before transformers 5.25)
# isort: on
from .drafts import (
    causal_lm_config,
    feature_head_from_target,
    feature_head_is_exact,
    natural_text_draft,
    perturb_head,
    random_text_draft,
    text_draft_from_target,
)
from .llava import IMAGE_SIZE, TinyOnevisionProcessor
from .mtp import mtp_from_target, write_mtp_checkpoint
from .registry import FIXTURES, FixtureFamily, families_of, fixture, fixture_of, register_fixture
from .shaping import BOS_ID, EOS_ID, UNK_ID, vision_module

FAMILIES = tuple(name for name, family in FIXTURES.items() if family.shared_suites)
HYBRID_FAMILIES = families_of("qwen3_5")  # linear-attention hybrids: tests/test_qwen3_5.py
# in FAMILIES, with stateful layers (Inkling's short convolutions): draft trees are refused (static caches run)
STATEFUL_FAMILIES = families_of("inkling")
TREE_FAMILIES = tuple(f for f in FAMILIES if f not in STATEFUL_FAMILIES)
LLAVA_FAMILIES = families_of("llava")
QWEN_FAMILIES = families_of("qwen_vl")
MORE_FAMILIES = families_of("gemma3") + families_of("idefics3") + families_of("internvl")  # upstream id layouts
MORE_FAMILIES += families_of("muse_glimmer")
MORE_FAMILIES += families_of("gemma4")  # Gemma 4, Gemma 4 Unified (transformers >= 5.24)
MORE_FAMILIES += families_of("llava_onevision1_5") + families_of("ovis2_5")  # transformers >= 5.25
MORE_FAMILIES += families_of("step3p7")  # Step3.7 (transformers >= 5.25)
MORE_FAMILIES += families_of("inkling")  # Inkling (transformers >= 5.25)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "FAMILIES",
    "FIXTURES",
    "IMAGE_SIZE",
    "LLAVA_FAMILIES",
    "MORE_FAMILIES",
    "QWEN_FAMILIES",
    "UNK_ID",
    "FixtureFamily",
    "HYBRID_FAMILIES",
    "STATEFUL_FAMILIES",
    "TREE_FAMILIES",
    "TinyOnevisionProcessor",
    "causal_lm_config",
    "family_ids",
    "feature_head_from_target",
    "mtp_from_target",
    "write_mtp_checkpoint",
    "feature_head_is_exact",
    "fixture",
    "fixture_of",
    "image_marker",
    "make_inputs",
    "natural_text_draft",
    "perturb_head",
    "random_text_draft",
    "register_fixture",
    "special_ids",
    "text_draft_from_target",
    "tiny_image",
    "tiny_processor",
    "tiny_target",
    "vision_module",
]


def _check_vocab(vocab_size: int) -> None:
    if vocab_size < 16:
        raise ValueError("vocab_size must be >= 16")


def special_ids(vocab_size: int = 128, family: str = "llava") -> dict[str, Any]:
    """The named special ids of ``family``'s fixtures for ``vocab_size`` (``eos`` one id; the Qwen-VL, Gemma 3,
    Idefics3 / SmolVLM and InternVL fixtures have a fixed layout)."""
    return fixture(family).special_ids(vocab_size)


def family_ids(family: str, vocab_size: int = 128) -> dict[str, Any]:
    """``image``, ``pad``, ``bos`` and ``eos`` ids of ``family``'s tiny fixtures (``eos`` a list)."""
    return fixture(family).ids(vocab_size)


def image_marker(family: str) -> str:
    """The text a prompt of ``family`` holds where its image goes (``<image>``, ``<start_of_image>``, ...)."""
    return fixture(family).image_marker


def tiny_target(family: str, seed: int = 0, vocab_size: int = 128, eos_bias: float | None = None) -> PreTrainedModel:
    """Build a random tiny multimodal target of ``family`` (float32, sdpa, eval mode).

    Logit shaping (a real VLM never emits ``<image>``): the lm_head rows of the reserved ids (image and
    layout ids, pads, rows past the tokenizer) get a logit of about -20 at every position while ordinary
    logits have a std of about 2 (:func:`~hf_specmm.testing.shaping.shape_lm`): they are essentially never
    generated, greedy or sampled.  EOS is as likely as any word: ~5% of random 30-token greedy rows stop
    early.  ``eos_bias`` is an approximate logit offset for EOS (``None`` = 0; e.g. 2.0 -> ~60% of rows stop
    early, 4.0 -> nearly all, -1.5 -> none, -30 -> never).  ``vocab_size`` sets the LLaVA fixtures' rows;
    the other families keep their upstream layout scaled down.
    """
    family_fixtures = fixture(family)
    _check_vocab(vocab_size)
    return family_fixtures.seeded_target(seed, vocab_size, eos_bias)


def tiny_processor(family: str, vocab_size: int = 128) -> ProcessorMixin:
    """Build the real transformers processor of ``family`` matching :func:`tiny_target`.

    The tokenizer is an offline WordLevel model (whitespace pre-tokenizer, left padding, simple chat
    template); the image processor is the PIL backend (no torchvision) sized for 32x32 inputs.  Placeholder
    expansion parameters (``patch_size``, ``vision_feature_select_strategy``, ...) match the tiny model.
    """
    family_fixtures = fixture(family)
    _check_vocab(vocab_size)
    return family_fixtures.processor(vocab_size)


def tiny_image(seed: int, size: tuple[int, int] = (32, 32)) -> Image.Image:
    """Deterministic random RGB image of ``size = (width, height)``."""
    rng = np.random.default_rng(seed)
    w, h = size
    return Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8), mode="RGB")


def make_inputs(family: str, processor: ProcessorMixin, prompts: list[str], images: list[Any],
                padding_side: str = "left", videos: list | None = None) -> BatchFeature:
    """Process a batch where row ``i`` has ``images[i]`` (or no image when ``None``).

    A row with an image whose prompt lacks the family's :func:`image_marker` gets it prepended. Rows are
    padded on ``padding_side`` (left by default, as needed for generate). Qwen-VL families: each row is a
    one-turn chat with ``<|vision_start|><|image_pad|><|vision_end|>`` per image before the prompt;
    ``images[i]`` may be a list (several images), ``videos[i]`` a ``(frames, (w, h), seed)`` video built as
    tensors (see :func:`hf_specmm.testing.qwen_vl.make_inputs`).
    """
    family_fixtures = fixture(family)
    if len(prompts) != len(images):
        raise ValueError("prompts and images must have the same length")
    return family_fixtures.inputs(processor, prompts, images, videos, padding_side)
