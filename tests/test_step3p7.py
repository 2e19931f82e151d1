"""Step3.7 (transformers 5.17 to 5.25): what its family reads from a prompt, stock's
assisted generation beside ours, ``hf_specmm.Auto`` over every exact draft kind and DFlash drafts. (The shared
matrices over ``testing.FAMILIES`` run its parity, trees, static caches, sampling and the draft kinds.)"""

from __future__ import annotations

import copy

import pytest
import torch
from packaging.version import Version

import hf_specmm
from hf_specmm import _compat, testing, versions
from hf_specmm.errors import UnsupportedGenerationError
from hf_specmm.targets import SUPPORTED_TARGETS, target_spec

FAMILY = "step3p7"
AVAILABLE = _compat.STEP3P7_SUPPORTED


def test_registered_only_where_transformers_has_it():
    assert ("Step3p7ForConditionalGeneration" in SUPPORTED_TARGETS) == AVAILABLE == (FAMILY in testing.FAMILIES)


needs_step3p7 = pytest.mark.skipif(not AVAILABLE, reason="this transformers has no Step3.7")


def _inputs(batch):
    from conftest import batch_inputs

    return batch_inputs(FAMILY, batch)


@needs_step3p7
def test_placeholder_runs_and_markers_by_name():
    from hf_specmm.testing.step3p7 import STEP3P7_LAYOUT

    model, proc = testing.tiny_target(FAMILY), testing.tiny_processor(FAMILY)
    vocab = STEP3P7_LAYOUT.vocab()
    patch = vocab["<im_patch>"]
    markers = {vocab[t] for t in ("<im_start>", "<im_end>", "<patch_start>", "<patch_end>", "<patch_newline>")}
    assert target_spec(model).dropped_ids == {patch}  # without a tokenizer the markers stay text
    assert target_spec(model, proc.tokenizer).dropped_ids == {patch} | markers
    inputs = testing.make_inputs(FAMILY, proc, ["describe the image"], [testing.tiny_image(0, (64, 32))])
    ids = inputs["input_ids"][0].tolist()
    crop = [vocab["<patch_start>"], patch, vocab["<patch_end>"]]
    expected = crop * 4 + [vocab["<patch_newline>"]] + crop * 4 + [vocab["<im_start>"]] + [patch] * 4 + [vocab["<im_end>"]]
    start = ids.index(vocab["<patch_start>"])
    assert ids[start:start + len(expected)] == expected  # 4x2 crops (one token each), then the global view
    assert inputs["num_local_patches"].tolist() == [8] and inputs["pixel_values_local"].shape[0] == 8


@needs_step3p7
def test_stock_runs_batch_1_only_and_ours_any_batch():
    model = testing.tiny_target(FAMILY)
    draft = testing.text_draft_from_target(model)
    one = _inputs(1)
    plain = model.generate(**one, max_new_tokens=10, do_sample=False)
    if versions.INSTALLED >= Version("5.25.0.dev0"):
        assert torch.equal(model.generate(**one, max_new_tokens=10, do_sample=False, assistant_model=draft), plain)
    else:  # 5.17's assisted generation hands the image inputs to the text draft
        with pytest.raises(ValueError, match=r"not used by the model: \['pixel_values', 'num_local_patches'\]"):
            model.generate(**one, max_new_tokens=10, do_sample=False, assistant_model=draft)
    two = _inputs(2)
    with pytest.raises(ValueError, match="batch_size = 1"):
        model.generate(**two, max_new_tokens=10, do_sample=False, assistant_model=draft)
    plain = model.generate(**two, max_new_tokens=10, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**two, max_new_tokens=10, do_sample=False, assistant_model=draft, num_assistant_tokens=3)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain)


@needs_step3p7
def test_placeholders_without_images_are_refused_before_any_work():
    model = testing.tiny_target(FAMILY)
    inputs = _inputs(1)
    inputs = {k: v for k, v in inputs.items() if k not in ("pixel_values", "pixel_values_local", "num_local_patches")}
    hf_specmm.enable(model)
    try:
        with pytest.raises(UnsupportedGenerationError):
            model.generate(**inputs, max_new_tokens=4, assistant_model=testing.text_draft_from_target(model))
    finally:
        hf_specmm.disable(model)


@needs_step3p7
def test_auto_over_every_exact_draft_kind_and_dflash():
    """``hf_specmm.Auto`` with plain steps, chains and trees in turn over every exact draft kind (batch 3, left
    padding, an image-less row, local crops): equal to plain, every drafted round accepted whole on text rows; a
    random DFlash drafter as a chain and as a block tree: equal to plain."""
    from test_auto import ALTERNATING, assert_drafted_rounds_accept_everything
    from test_trees_generate import exact_drafts, generate, sharp_target

    from hf_specmm.drafts.dflash import dflash_draft_for

    model = sharp_target(FAMILY)
    inputs, text = _inputs(3), testing.make_inputs(FAMILY, testing.tiny_processor(FAMILY),
                                                     ["what color is the circle ?", "describe the image"], [None, None])
    plain, plain_text = (model.generate(**x, max_new_tokens=16, do_sample=False) for x in (inputs, text))
    with torch.no_grad():
        for name, draft in exact_drafts(FAMILY, model).items():
            out, _ = generate(model, inputs, max_new_tokens=16, assistant_model=hf_specmm.Auto(draft, shapes=ALTERNATING))
            assert torch.equal(out, plain), name
            out, stats = generate(model, text, max_new_tokens=16,
                                  assistant_model=hf_specmm.Auto(copy.deepcopy(draft), shapes=ALTERNATING))
            assert torch.equal(out, plain_text), name
            assert_drafted_rounds_accept_everything(stats, name)
        dflash = dflash_draft_for(model, block_size=4, target_layer_ids=[0, 1])
        for assistant in (dflash, hf_specmm.Tree(dflash, top_k=2, depth=3, nodes=5)):
            out, stats = generate(model, inputs, max_new_tokens=16, assistant_model=assistant)
            assert torch.equal(out, plain) and stats.drafted_tokens > 0


@needs_step3p7
def test_bench_tiny_preset_is_lossless_for_text_drafts_and_heads():
    """``tiny-step3.7`` at batch 3 (an image per row, left padding): a text draft and a feature head in the
    bench's controlled acceptance are lossless and see the same acceptance pattern."""
    from hf_specmm.bench import BenchConfig, run_benchmark

    config = BenchConfig(preset="tiny-step3.7", gammas=[3], batch_sizes=[3], acceptance=0.7, max_new_tokens=24,
                         repeats=1, warmup=0, draft_kinds=["text_only", "feature_head"])
    text, head = run_benchmark(config, progress=False)["rows"]
    assert 1.0 < text["tau"] < 4.0 and text["lossless"] is True and head["lossless"] is True
    assert (head["tau"], head["acceptance"], head["rounds"]) == (text["tau"], text["acceptance"], text["rounds"])
