"""Fixture families: how to build one target family's tiny offline fixtures, registered by name.

As :mod:`hf_specmm.targets` registers what the core must know about a real target family, each module of
this package registers a :class:`FixtureFamily` per family it builds (``llava.py``: ``llava``,
``llava_next``, ``llava_onevision``; ``qwen_vl.py``; ``gemma3.py``; ``idefics3.py``; ``internvl.py``). The
public functions of :mod:`hf_specmm.testing` look the family up and call its methods; nothing branches
on lists of family names.

    >>> from hf_specmm.testing import fixture
    >>> fixture("llava").image_marker
    '<image>'
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import AutoModelForCausalLM, BatchFeature, PretrainedConfig, PreTrainedModel, ProcessorMixin

from ..targets import target_family
from .shaping import llama_random_draft


class FixtureFamily:
    """The tiny fixtures of one target family. Subclasses set :attr:`name` and implement :meth:`target`,
    :meth:`processor`, :meth:`ids` and :meth:`natural_draft_vocab`; the rest has defaults."""

    name: str = ""
    image_marker: str = "<image>"  # the text a prompt holds where its image goes
    images_per_row: bool = False  # the processor takes each row's images as a list (Idefics3, Gemma 3, ...)
    group: str = ""  # the family group (the module that builds it), for the tests' per-group matrices
    #: in ``testing.FAMILIES``, which parametrizes the shared suites; False: a family whose forwards are too slow
    #: on a CPU for every suite (Qwen3.5's reference linear-attention kernels) runs a lean suite of its own
    shared_suites: bool = True
    #: relative noise of the shared suites' "noisy" feature head (a partial acceptance at every γ)
    head_noise: float = 0.05

    def target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
        """The tiny target (called by :meth:`seeded_target`)."""
        raise NotImplementedError

    def seeded_target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
        """:meth:`target` with torch's global RNG seeded by ``seed`` inside a fork (the caller's RNG is kept)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.target(seed, vocab_size, eos_bias)

    def processor(self, vocab_size: int) -> ProcessorMixin:
        raise NotImplementedError

    def ids(self, vocab_size: int) -> dict[str, Any]:
        """``image``, ``pad``, ``bos`` (or None) and ``eos`` (a list), and any family-specific extras."""
        raise NotImplementedError

    def special_ids(self, vocab_size: int) -> dict[str, Any]:
        """The named special ids with ``eos`` as one id (the first EOS)."""
        ids = self.ids(vocab_size)
        return {**ids, "eos": ids["eos"][0]}

    def natural_draft_vocab(self, target: PreTrainedModel) -> int:
        """Rows of the family's natural text draft (cut to the text ids, or grown past the target's)."""
        raise NotImplementedError

    def causal_lm_config(self, target: PreTrainedModel) -> PretrainedConfig:
        """A copy of the target's text config as a plain ``*ForCausalLM`` config."""
        return copy.deepcopy(target.config.get_text_config())

    def text_lm(self, config: PretrainedConfig, attn_implementation: str) -> PreTrainedModel:
        """A causal LM built from :meth:`causal_lm_config` (the ``*ForCausalLM`` of its model type)."""
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)

    def random_draft(self, target: PreTrainedModel, seed: int, vocab_size: int | None,
                     eos_bias: float | None) -> PreTrainedModel:
        """A different random 1-layer / hidden-32 causal LM of the target's LM family."""
        return llama_random_draft(target, seed, vocab_size, eos_bias)

    def inputs(self, processor: ProcessorMixin, prompts: list[str], images: list[Any], videos: list | None,
               padding_side: str) -> BatchFeature:
        """One processor call: a row with an image whose prompt lacks :attr:`image_marker` gets it prepended."""
        if videos is not None and any(v is not None for v in videos):
            raise ValueError(f"the {self.name} fixtures take no videos (the Qwen-VL fixtures do)")
        marker = self.image_marker
        texts = [p if img is None or marker in p else f"{marker} {p}" for p, img in zip(prompts, images)]
        present: list[Any] = [img for img in images if img is not None]
        if self.images_per_row and present:
            present = [[] if img is None else [img] for img in images]
        processor.tokenizer.padding_side = padding_side
        return processor(images=present or None, text=texts, padding=True, return_tensors="pt")


FIXTURES: dict[str, FixtureFamily] = {}  # family name -> its fixtures, in registration order


def register_fixture(family: FixtureFamily) -> FixtureFamily:
    """Add ``family`` (called once by the module that builds it). Registering a name twice is an error."""
    if family.name in FIXTURES and FIXTURES[family.name] is not family:
        raise ValueError(f"fixture family {family.name!r} is already registered")
    FIXTURES[family.name] = family
    return family


def fixture(name: str) -> FixtureFamily:
    """The registered fixtures of family ``name``; raises listing the known ones."""
    if name not in FIXTURES:
        raise ValueError(f"unknown family {name!r}; expected one of {tuple(FIXTURES)}")
    return FIXTURES[name]


def fixture_of(model: PreTrainedModel) -> FixtureFamily:
    """The fixtures of ``model``'s target family (by its registered class, see :mod:`hf_specmm.targets`)."""
    return fixture(target_family(model).name)


def families_of(group: str) -> tuple[str, ...]:
    return tuple(name for name, f in FIXTURES.items() if f.group == group)


__all__ = ["FIXTURES", "FixtureFamily", "families_of", "fixture", "fixture_of", "register_fixture"]
