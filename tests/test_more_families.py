"""Gemma 3, Idefics3 / SmolVLM and InternVL targets with their natural text drafts (vocabulary cut to the
text ids, or larger than the target's), what a text-only draft reads of their image blocks, Gemma 3's
sliding-window layers under rollback, sampling, the pipeline and the training CLI."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import pipeline

import hf_specmm
import hf_specmm.loop as loop
from hf_specmm import testing
from hf_specmm.cache_state import SlottedCache
from hf_specmm.drafts.text_only import text_only_view
from hf_specmm.fixtures_more_vlms import image_marker
from hf_specmm.targets import target_spec
from hf_specmm.vocab import VocabMap, check_vocab_compatible
from conftest import PROMPTS, batch_inputs, processor, target

FAMILIES = testing.MORE_FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_natural_drafts_are_lossless_and_never_propose_what_the_target_lacks(family):
    """Natural-vocabulary drafts (exact, noised), left-padded batches of 1 and 3 with and without images."""
    model = testing.tiny_target(family)
    exact, noised = testing.natural_text_draft(model), testing.natural_text_draft(model, noise=0.6)
    spec = target_spec(model)
    vocab = VocabMap(spec, exact.config.vocab_size, torch.device("cpu"))
    logits = vocab.to_target(torch.zeros(1, exact.config.vocab_size))
    assert logits.shape[-1] == spec.vocab_size  # InternVL: the draft's extra rows are cut off
    assert torch.isinf(logits[0, sorted(spec.reserved_ids)]).all()
    for batch, images in ((1, True), (3, True), (3, False)):
        inputs = batch_inputs(family, batch, images)
        plain = model.generate(**inputs, max_new_tokens=20, do_sample=False)
        hf_specmm.enable(model)
        for d in (exact, noised):
            for gamma in (1, 3, 5):
                out = model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=d,
                                     num_assistant_tokens=gamma)
                assert torch.equal(out, plain), f"{family} batch={batch} images={images} γ={gamma}"
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_natural_exact_draft_accepts_everything_on_text_prompts(family):
    """InternVL's grown rows have the draft's highest logits: 100 % acceptance shows they are never proposed."""
    model = testing.tiny_target(family, eos_bias=-30.0)
    inputs = batch_inputs(family, 3, with_images=False)
    hf_specmm.enable(model)
    model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=testing.natural_text_draft(model),
                   num_assistant_tokens=4)
    stats = hf_specmm.last_stats(model)
    assert stats.acceptance_rate == 1.0 and stats.drafted_tokens > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_text_only_view_is_the_prompt_without_its_image_block(family):
    """A text-only draft reads a row with an image exactly as the same prompt without the image: the
    placeholders AND the layout tokens around them (<start_of_image>, <row_i_col_j>, <global-img>,
    <fake_token_around_image>, <img>, </img>) are dropped."""
    model, proc = target(family), processor(family)
    with_image = testing.make_inputs(family, proc, PROMPTS, [testing.tiny_image(i, (64, 32)) for i in range(3)])
    without = testing.make_inputs(family, proc, PROMPTS, [None] * 3)
    vocab = VocabMap(target_spec(model), model.config.text_config.vocab_size, torch.device("cpu"))
    ids, valid = text_only_view(vocab, with_image["input_ids"], with_image["attention_mask"])
    ref_ids, ref_valid = text_only_view(vocab, without["input_ids"], without["attention_mask"])
    assert with_image["input_ids"].shape[1] >= without["input_ids"].shape[1] + 6  # 4 placeholders + 2 markers at least
    assert torch.equal(ids[valid], ref_ids[ref_valid]) and torch.equal(valid, ref_valid)


def test_draft_vocabularies_smaller_and_larger_than_the_target():
    """check_vocab_compatible: SmolLM2-like (text ids only) and Qwen2.5-like (more rows) drafts pass, one
    id fewer than the text vocabulary fails."""
    for family, size in (("smolvlm", 96), ("idefics3", 96), ("gemma3", 128), ("internvl", 144)):
        spec = target_spec(target(family))
        assert spec.text_vocab_end == testing.family_ids(family)["text_end"]
        check_vocab_compatible(spec, testing.random_text_draft(target(family), vocab_size=size))
        with pytest.raises(hf_specmm.IncompatibleDraftError):
            check_vocab_compatible(spec, testing.random_text_draft(target(family), vocab_size=spec.text_vocab_end - 1))


# ---- Gemma 3: sliding-window layers ----------------------------------------------------------------------


def _run_gemma(monkeypatch=None, compact: bool = True) -> int:
    model = target("gemma3")
    if not compact:
        class NoCompaction(SlottedCache):
            def __init__(self, *args, **kwargs):
                kwargs["compact"] = False
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(loop, "SlottedCache", NoCompaction)
    mismatches = 0
    for images in (True, False):
        inputs = batch_inputs("gemma3", 3, images)
        plain = model.generate(**inputs, max_new_tokens=24, do_sample=False)
        assert inputs["input_ids"].shape[1] + 24 > 2 * model.config.text_config.sliding_window  # windows slide
        hf_specmm.enable(model)
        for kind in ("random", "self"):
            d = testing.random_text_draft(model) if kind == "random" else testing.text_draft_from_target(model)
            for gamma in (1, 3, 5):
                out = model.generate(**inputs, max_new_tokens=24, do_sample=False, assistant_model=d,
                                     num_assistant_tokens=gamma)
                mismatches += int(not torch.equal(out, plain))
        hf_specmm.disable(model)
    return mismatches


def test_gemma3_sliding_window_rows_with_holes_are_compacted(monkeypatch):
    """Rows of a batch accept different numbers of drafts. With holes left in the cache, a sliding
    window (counted in slots) would cover other tokens than plain generate's: the fixture catches it."""
    assert "sliding_attention" in target("gemma3").config.text_config.layer_types
    assert _run_gemma() == 0
    assert _run_gemma(monkeypatch, compact=False) > 0


def test_gemma3_vlm_draft_needs_token_type_ids(monkeypatch):
    """An exact copy of Gemma 3 as a `vlm` draft is accepted 100 % with images because its prefill gets
    token_type_ids (bidirectional attention within each image); without them it would not be exact."""
    import dataclasses
    import copy

    from hf_specmm.targets import SUPPORTED_TARGETS

    model = testing.tiny_target("gemma3", eos_bias=-30.0)
    inputs = batch_inputs("gemma3", 3)
    hf_specmm.enable(model)
    draft = copy.deepcopy(model)
    rates = []
    for per_call in (("pixel_values", "token_type_ids"), ("pixel_values",)):
        family = SUPPORTED_TARGETS["Gemma3ForConditionalGeneration"]
        monkeypatch.setitem(SUPPORTED_TARGETS, family.class_name, dataclasses.replace(family, per_call_inputs=per_call))
        model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=draft, num_assistant_tokens=4)
        rates.append(hf_specmm.last_stats(model).acceptance_rate)
    assert rates[0] == 1.0 > rates[1], rates


def test_gemma3_second_eos_ends_rows():
    """<end_of_turn> is an EOS next to <eos> (generation_config.eos_token_id is a list)."""
    model = testing.tiny_target("gemma3", seed=3, eos_bias=2.0)
    eos = model.generation_config.eos_token_id
    assert isinstance(eos, list) and len(eos) == 2
    inputs = batch_inputs("gemma3", 3)
    plain = model.generate(**inputs, max_new_tokens=30, do_sample=False)
    hf_specmm.enable(model)
    out = model.generate(**inputs, max_new_tokens=30, do_sample=False,
                         assistant_model=testing.natural_text_draft(model), num_assistant_tokens=3)
    assert torch.equal(out, plain)
    new = plain[:, inputs["input_ids"].shape[1]:]
    assert torch.isin(new, torch.tensor(eos)).any(dim=1).sum() >= 2, new


# ---- sampling: χ² on InternVL (draft vocabulary larger than the target's) -----------------------------------


def test_speculative_sampling_matches_plain_internvl():
    from test_sampling import ALPHA, N, NEW, SAMPLING, chi2_homogeneity_pvalue

    family = "internvl"
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    inputs = testing.make_inputs(family, processor(family), ["what color is the circle ?"] * N,
                                 [testing.tiny_image(0)] * N)
    torch.manual_seed(1)
    plain = model.generate(**inputs, **SAMPLING)[:, inputs["input_ids"].shape[1]:]
    hf_specmm.enable(model)
    torch.manual_seed(2)
    spec = model.generate(**inputs, **SAMPLING, assistant_model=testing.natural_text_draft(model, noise=0.6),
                          num_assistant_tokens=3)[:, inputs["input_ids"].shape[1]:]
    stats = hf_specmm.last_stats(model)
    assert 0.0 < stats.acceptance_rate < 0.9, stats.acceptance_rate
    assert int(spec.max()) < model.config.text_config.vocab_size
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], model.config.text_config.vocab_size)
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g} < {ALPHA}"


# ---- pipeline("image-text-to-text") ----------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_with_a_draft(family):
    model = testing.tiny_target(family)
    pipe = pipeline("image-text-to-text", model=model, processor=testing.tiny_processor(family))
    marker = image_marker(family)
    images = [[testing.tiny_image(10 + i, s)] for i, s in enumerate([(32, 32), (64, 32), (32, 64)])]
    texts = [f"{marker} {p}" for p in PROMPTS]

    def call(extra):
        return pipe(images=images, text=texts, batch_size=3,
                    generate_kwargs={"max_new_tokens": 12, "do_sample": False, **extra})

    plain = call({})
    hf_specmm.enable(pipe.model)
    for d in (testing.natural_text_draft(pipe.model), testing.text_draft_from_target(pipe.model)):
        assert call({"assistant_model": d}) == plain
        assert hf_specmm.last_stats(pipe.model).batch_size == 3


# ---- training CLI ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family,kind", [("gemma3", "text_only"), ("idefics3", "image_adapter")])
def test_train_cli_with_a_saved_target(family, kind, tmp_path):
    """`hf-specmm train --target <folder>` on a saved tiny target (the SmolVLM and InternVL processors
    cannot be reloaded here: their video processors need torchvision, SmolVLM's also num2words)."""
    from hf_specmm.cli import main

    folder = tmp_path / f"tiny-{family}"
    testing.tiny_target(family, eos_bias=-30.0).save_pretrained(folder)
    testing.tiny_processor(family).save_pretrained(folder)
    from transformers import AutoProcessor

    try:  # transformers 5.17 resolves the saved Idefics3 image processor only with torchvision installed
        AutoProcessor.from_pretrained(folder)
    except (ValueError, ImportError) as err:
        if "torchvision" not in str(err):
            raise
        pytest.skip(f"this transformers cannot reload the saved {family} processor without torchvision")
    (tmp_path / "imgs").mkdir()
    words = ["what", "color", "is", "the", "circle", "describe", "image", "dog", "cat", "red"]
    lines = []
    for i in range(12):
        prompt = " ".join(words[(i + k) % len(words)] for k in range(4))
        image = None
        if i % 2:
            image = f"im{i}.png"
            testing.tiny_image(i, (32 + 32 * (i % 3 == 1), 32)).save(tmp_path / "imgs" / image)
        lines.append(json.dumps({"image": image, "prompt": prompt}))
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    args = ["train", "--target", str(folder), "--data", str(tmp_path / "data.jsonl"),
            "--images", str(tmp_path / "imgs"),
            "--output-dir", str(out), "--steps", "4", "--batch-size", "4", "--max-new-tokens", "6", "--gamma", "3",
            "--eval-fraction", "0.25", "--draft-config", json.dumps({"num_hidden_layers": 1, "hidden_size": 32,
                                                                     "num_attention_heads": 2}), "--no-progress",
            "--draft-kind", kind] + (["--stage2-steps", "4"] if kind == "image_adapter" else [])
    assert main(args) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["tau_after"]["block_efficiency"] >= 1.0
    draft = hf_specmm.load_draft(str(out / "draft"))
    model = testing.tiny_target(family, eos_bias=-30.0)
    inputs = batch_inputs(family, 3)
    plain = model.generate(**inputs, max_new_tokens=10, do_sample=False)
    hf_specmm.enable(model)
    assert torch.equal(model.generate(**inputs, max_new_tokens=10, do_sample=False, assistant_model=draft), plain)
