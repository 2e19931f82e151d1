"""Gemma 3, Idefics3 / SmolVLM and InternVL targets with their natural text drafts (vocabulary cut to the
text ids, or larger than the target's), what a text-only draft reads of their image blocks, Gemma 3's
sliding-window layers under rollback, sampling, the pipeline and the training CLI."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
from transformers import pipeline

import hf_specmm
import hf_specmm.caches.dynamic as dynamic_caches
from hf_specmm import testing
from hf_specmm.testing import idefics3 as idefics3_fixtures
from hf_specmm.drafts.text_only import text_only_view
from hf_specmm.targets import target_spec
from hf_specmm.vocab import VocabMap, check_vocab_compatible
from conftest import PROMPTS, batch_inputs, processor, target, LEAN_FAMILIES

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
    lean = family in LEAN_FAMILIES  # Gemma 4: the natural draft has the target's rows (parity covers it)
    for batch, images in ((3, True),) if lean else ((1, True), (3, True), (3, False)):
        inputs = batch_inputs(family, batch, images)
        plain = model.generate(**inputs, max_new_tokens=20, do_sample=False)
        hf_specmm.enable(model)
        for d in (exact, noised):
            for gamma in (3,) if lean else (1, 3, 5):
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
    <fake_token_around_image>, <img>, </img>, read by name from the tokenizer) are dropped."""
    model, proc = target(family), processor(family)
    with_image = testing.make_inputs(family, proc, PROMPTS, [testing.tiny_image(i, (64, 32)) for i in range(3)])
    without = testing.make_inputs(family, proc, PROMPTS, [None] * 3)
    vocab = VocabMap(target_spec(model, proc.tokenizer), model.config.text_config.vocab_size, torch.device("cpu"))
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
        class NoCompaction(dynamic_caches.DynamicSlottedCache):
            def __init__(self, *args, **kwargs):
                kwargs["compact"] = False
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(dynamic_caches, "DynamicSlottedCache", NoCompaction)
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
    marker = testing.image_marker(family)
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
def test_train_cli_with_a_saved_target(family, kind, tmp_path, capsys):
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
    plan = ("stage 1 (language) 4 steps + stage 2 (multimodal) 4 steps = 8" if kind == "image_adapter" else
            "stage 1 (language) 4 steps = 4")  # printed before any forward; what the run then did
    assert (f"hf-specmm train: 1 process on cpu; batch 4 per process x 1 process x 1 accumulated = 4 examples "
            f"per optimizer step; {kind} draft: {plan} optimizer steps") in capsys.readouterr().out
    assert summary["global_step"] == int(plan.split("= ")[1])
    assert summary["tau_after"]["block_efficiency"] >= 1.0
    draft = hf_specmm.load_draft(str(out / "draft"))
    model = testing.tiny_target(family, eos_bias=-30.0)
    inputs = batch_inputs(family, 3)
    plain = model.generate(**inputs, max_new_tokens=10, do_sample=False)
    hf_specmm.enable(model)
    assert torch.equal(model.generate(**inputs, max_new_tokens=10, do_sample=False, assistant_model=draft), plain)


# ---- layout tokens read by name (SmolVLM / Idefics3, InternVL) ------------------------------------------


@pytest.fixture
def fresh_warnings(monkeypatch):
    import hf_specmm.vocab

    monkeypatch.setattr(hf_specmm.vocab, "_WARNED", set())


def test_layout_ids_read_by_name_or_kept_apart_as_a_guess():
    """With the tokenizer the layout ids are its named tokens; without, the upstream positions are only a
    guess: neither dropped nor reserved, yet past the text vocabulary for the draft-vocabulary check."""
    layouts = {"idefics3": idefics3_fixtures.LAYOUT_TOKENS, "smolvlm": idefics3_fixtures.LAYOUT_TOKENS,
               "internvl": ["<img>", "</img>"]}
    for family, names in layouts.items():
        model, tok = target(family), processor(family).tokenizer
        named, guessed = target_spec(model, tok), target_spec(model)
        ids = set(tok.convert_tokens_to_ids(list(names)))
        assert len(ids) == len(names) and ids <= named.dropped_ids and ids <= named.reserved_ids
        assert guessed.unverified_layout_ids == ids and not ids & (guessed.dropped_ids | guessed.reserved_ids)
        assert named.text_vocab_end == guessed.text_vocab_end == testing.family_ids(family)["text_end"]
    assert not target_spec(target("gemma3")).unverified_layout_ids  # its markers are named by the config


@pytest.mark.parametrize("family", ["smolvlm", "idefics3"])
def test_relaid_tokenizer_keeps_exact_copy_acceptance_on_text_prompts(family, fresh_warnings):
    """A target and tokenizer with ordinary words in the 38 ids below <image> (a fine-tune with added tokens):
    the positional rule would drop them from the draft's view (an exact copy is then accepted at 0.21 in
    this fixture); read by name (tokenizer=) or left readable without a tokenizer (warned once), an exact copy
    is accepted 100 %."""
    model = idefics3_fixtures.relaid_target(family, eos_bias=-30.0)
    relaid = idefics3_fixtures.relaid_processor(family)
    inputs = testing.make_inputs(family, relaid, PROMPTS, [None] * 3)
    guess = torch.tensor(sorted(target_spec(model).unverified_layout_ids))
    assert torch.isin(inputs["input_ids"], guess).any()  # words where the upstream layout has layout tokens
    draft = testing.text_draft_from_target(model)
    spec = target_spec(model)
    positional = dataclasses.replace(spec, dropped_ids=spec.dropped_ids | set(guess.tolist()),
                                     unverified_layout_ids=frozenset())  # the rule before layout ids were read by name
    dropped_words = ~VocabMap(positional, 136, torch.device("cpu")).visible_prompt(inputs["input_ids"],
                                                                                   inputs["attention_mask"])
    assert (dropped_words & inputs["attention_mask"].bool()).any()  # what the positional rule did
    named = target_spec(model, relaid.tokenizer)
    assert named.dropped_ids == {134} | set(relaid.tokenizer.convert_tokens_to_ids(idefics3_fixtures.LAYOUT_TOKENS))
    hf_specmm.enable(model)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.generate(**inputs, max_new_tokens=32, do_sample=False, assistant_model=draft,
                           tokenizer=relaid.tokenizer)
            assert hf_specmm.last_stats(model).acceptance_rate == 1.0
            assert not [w for w in caught if "tokenizer" in str(w.message)]
            for _ in range(2):  # warned once
                model.generate(**inputs, max_new_tokens=32, do_sample=False, assistant_model=draft)
                assert hf_specmm.last_stats(model).acceptance_rate == 1.0
        messages = [str(w.message) for w in caught if "tokenizer=processor.tokenizer" in str(w.message)]
        assert len(messages) == 1 and f"{family} target without its tokenizer" in messages[0]
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", ["smolvlm", "internvl"])
def test_layout_guess_is_silent_where_the_draft_cannot_read_it(family, fresh_warnings):
    """A natural SmolLM2-sized draft ends right below the guessed ids: it reads none of them either way,
    so image prompts without a tokenizer give no warning; an exact copy that covers them is warned once."""
    model = target(family)
    inputs = batch_inputs(family, 3)
    hf_specmm.enable(model)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.generate(**inputs, max_new_tokens=4, assistant_model=testing.natural_text_draft(model))
            silent = family == "smolvlm"  # InternVL's natural draft is LARGER than the target: it covers them
            assert silent == (not [w for w in caught if "without its tokenizer" in str(w.message)])
            model.generate(**inputs, max_new_tokens=4, assistant_model=testing.text_draft_from_target(model),
                           tokenizer=processor(family).tokenizer)
            model.generate(**inputs, max_new_tokens=4, assistant_model=testing.text_draft_from_target(model))
        assert len([w for w in caught if "without its tokenizer" in str(w.message)]) == 1
    finally:
        hf_specmm.disable(model)
