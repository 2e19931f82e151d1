"""Shared tiny fixtures: targets, processors and drafts are built once per session (no downloads)."""

from __future__ import annotations

import functools
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)  # tiny models: extra threads only contend for the 2 cores

from hf_specmm import testing  # noqa: E402

PROMPTS = ["what color is the circle ?", "describe the image", "how many dog are there in the picture ? show it"]


@functools.lru_cache(maxsize=None)
def target(family: str, seed: int = 0):
    return testing.tiny_target(family, seed=seed)


@functools.lru_cache(maxsize=None)
def processor(family: str):
    return testing.tiny_processor(family)


@functools.lru_cache(maxsize=None)
def draft(family: str, kind: str):
    t = target(family)
    if kind == "self":
        return testing.text_draft_from_target(t)
    if kind == "random":  # smaller vocabulary, like a 32000-row Llama draft for a 32064-row LLaVA-1.5
        return testing.random_text_draft(t, vocab_size=t.config.text_config.vocab_size - 4)
    raise ValueError(kind)


def batch_inputs(family: str, batch: int, with_images: bool = True):
    """Left-padded rows of different lengths; with images, row 1 has none and images differ in size."""
    sizes = [(32, 32), None, (64, 32)] if with_images else [None, None, None]
    images = [None if s is None else testing.tiny_image(i, s) for i, s in enumerate(sizes)][:batch]
    return testing.make_inputs(family, processor(family), PROMPTS[:batch], images)


def refused_kind(family: str, kind: str) -> str | None:
    """Why ``family`` refuses draft kind ``kind`` before any work, or None (no family refuses a kind now; a
    family that does is skipped by the shared matrices and checks its refusal in its own tests)."""
    from hf_specmm.targets import target_family

    return dict(target_family(target(family)).refused_draft_kinds).get(kind)


def skip_refused(family: str, kind: str) -> None:
    if refused_kind(family, kind):
        pytest.skip(f"{family} refuses {kind} drafts before any work (tests/test_gemma4.py)")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# Families added later run the heaviest matrices on representative cells (CI time on 2 cores: batch 3
# has left padding, a row without an image and two image sizes); every cell of these matrices still runs for
# the ten original families. test -> the cell ids kept (substrings of the test id).
LEAN_FAMILIES = ("qwen3_vl_moe", "muse_glimmer") + testing.families_of("gemma4") + testing.families_of("step3p7")
LEAN_CELLS = {
    "test_self_draft.py::test_self_draft_accepts_everything": ("-3-",),
    "test_parity.py::test_greedy_parity": ("random-3", "self-3"),
    "test_feature_head.py::test_greedy_parity": ("exact-3",),
    "test_image_adapter.py::test_adapter_greedy_parity": ("self-1-3",),
    "test_vlm_draft.py::test_vlm_draft_greedy_parity": ("noised-3",),
    "test_eagle3.py::test_greedy_parity": ("[1-",),  # batch 3 heads: test_feature_head exact-3, test_gemma4
    "test_trees_generate.py::test_tree_greedy_parity_text_drafts": ("[3-",),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        family = getattr(item, "callspec", None) and item.callspec.params.get("family")
        if family not in LEAN_FAMILIES:
            continue
        test = f"{item.path.name}::{item.originalname}"
        kept = LEAN_CELLS.get(test)
        if kept and not any(cell in item.name for cell in kept):
            item.add_marker(pytest.mark.skip(reason=f"lean CI for {family}: {test} runs its {kept} cell(s)"))
