"""Gemma 4 / Gemma 4 Unified specifics (transformers >= 5.24; skipped before): what is refused before any work
(audio and video inputs, EAGLE-1 / EAGLE-3 feature heads), and the prefill's bidirectional image
attention that a ``vlm`` draft must reproduce. The shared matrices over ``testing.FAMILIES`` cover the rest."""

from __future__ import annotations

import pytest
import torch
import hf_specmm
from hf_specmm import _compat
from hf_specmm import testing
from hf_specmm.errors import IncompatibleDraftError, UnsupportedGenerationError
from conftest import batch_inputs, target
from test_bad_inputs import count_forwards as count_forwards_of

pytestmark = pytest.mark.skipif(not _compat.GEMMA4_SUPPORTED, reason="Gemma 4 targets need transformers >= 5.24")
FAMILIES = ("gemma4", "gemma4_unified")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["input_features", "pixel_values_videos"])
def test_audio_and_video_inputs_are_refused_before_any_forward(family, name):
    model = target(family)
    inputs = dict(batch_inputs(family, 1))
    inputs[name] = torch.zeros(1, 4, 8)
    hf_specmm.enable(model)
    try:
        with count_forwards_of(model) as calls, pytest.raises(UnsupportedGenerationError, match=name):
            model.generate(**inputs, max_new_tokens=4, assistant_model=testing.text_draft_from_target(model))
        assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_feature_heads_are_refused_before_any_forward(family):
    """EAGLE-1 / EAGLE-3 heads: none is made for a Gemma 4 target, and one made for another target is refused
    by generate (as a chain or a tree) before any forward, naming the kind."""
    model = target(family)
    for variant in ("eagle1", "eagle3"):
        with pytest.raises(IncompatibleDraftError, match="feature head"):
            hf_specmm.FeatureHeadDraft.for_target(model, variant=variant)
    other = testing.feature_head_from_target(target("gemma3"))
    hf_specmm.enable(model)
    try:
        for assistant in (other, hf_specmm.Tree(other, top_k=2, depth=2, tokens=4)):
            with count_forwards_of(model) as calls, pytest.raises(IncompatibleDraftError, match="feature_head"):
                model.generate(**batch_inputs(family, 1), max_new_tokens=4, assistant_model=assistant)
            assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)
    assert {k for k, _ in hf_specmm.targets.target_family(model).refused_draft_kinds} == {"feature_head", "eagle3"}


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_image_attention_is_bidirectional_and_a_vlm_copy_is_exact(family):
    """Dropping mm_token_type_ids changes the prefill (what stock assisted generation would need to do to
    run); the vlm copy gets them in its prefill and is accepted 100 % with images, batched."""
    model = target(family)
    inputs = batch_inputs(family, 3)
    with torch.no_grad():
        full = model(**inputs).logits[:, -1]
        causal = model(**{k: v for k, v in inputs.items() if k != "mm_token_type_ids"}).logits[:, -1]
    assert (full - causal).abs().max() > 1e-3
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False, assistant_model=model,
                             num_assistant_tokens=4)
        assert torch.equal(out, plain)
        assert hf_specmm.last_stats(model).acceptance_rate == 1.0
    finally:
        hf_specmm.disable(model)


def test_bench_tiny_gemma4_preset_runs_losslessly_with_margins():
    """The tiny version of the gemma4-e2b-shape preset (same input builder, fixture-sized): image blocks as the
    processor writes them, every mode lossless, greedy margins far above bf16 rounding (the margin rule holds
    on Gemma 4's post-norm, per-layer-embedding layers)."""
    from hf_specmm.bench import BenchConfig, run_benchmark
    from hf_specmm.bench.margins import MIN_MARGIN_ULPS, greedy_margins
    from hf_specmm.bench.presets import PRESETS, build_preset, synthetic_inputs

    assert {"gemma4-e2b-shape", "tiny-gemma4"} <= set(PRESETS)
    preset = build_preset("tiny-gemma4")
    inputs = synthetic_inputs(preset, 2, 12)
    config = preset.target.config
    assert (inputs["input_ids"] == config.image_token_id).sum() == 2 * 4
    assert torch.equal(inputs["mm_token_type_ids"], (inputs["input_ids"] == config.image_token_id).long())
    assert greedy_margins(preset.target, inputs, max_new_tokens=8)["min_margin_ulps"] >= MIN_MARGIN_ULPS
    result = run_benchmark(BenchConfig(preset="tiny-gemma4", gammas=[3], batch_sizes=[2], acceptance=1.0,
                                       max_new_tokens=12, repeats=1, warmup=0), progress=False)
    (row,) = result["rows"]
    assert row["lossless"] is True and row["tau"] > 1.0


def test_bench_gemma4_e2b_shape_configs():
    """The E2B-shaped preset's configs without allocating its parameters: built on the meta device."""
    from hf_specmm.bench.presets_gemma4 import draft_270m, target_e2b
    from hf_specmm.targets import target_spec

    target, draft = target_e2b(torch.bfloat16, "meta"), draft_270m(torch.bfloat16, "meta")
    text = target.config.text_config
    assert type(target).__name__ == "Gemma4ForConditionalGeneration" and text.hidden_size_per_layer_input == 256
    assert text.vocab_size == draft.config.vocab_size == 262144
    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    print(f"gemma4-e2b-shape: target {n_target / 1e9:.2f}B parameters, draft {n_draft / 1e6:.0f}M")
    assert 0.25e9 < n_draft < 0.3e9, n_draft
    spec = target_spec(target)
    assert spec.text_vocab_end == 258880 and {255999, 256000, 258880, 258881, 258882, 258883, 258884} == spec.dropped_ids


def test_speculative_sampling_matches_plain_on_gemma4():
    """χ² homogeneity per generated position (as tests/test_sampling.py, at its level): rows with an image,
    sampled plainly and speculatively with a text-only noisy copy of the target's LM."""
    from test_sampling import ALPHA, NEW, SAMPLING, chi2_homogeneity_pvalue, noisy_copy

    model = testing.tiny_target("gemma4", seed=0, eos_bias=-30.0)
    rows = 300  # half of test_sampling's N: the Gemma 4 vision tower reads a padded 280-patch budget per image
    inputs = testing.make_inputs("gemma4", testing.tiny_processor("gemma4"), ["what color is the circle ?"] * rows,
                                 [testing.tiny_image(0)] * rows)
    torch.manual_seed(1)
    plain = model.generate(**inputs, **SAMPLING)[:, inputs["input_ids"].shape[1]:]
    hf_specmm.enable(model)
    try:
        torch.manual_seed(2)
        spec = model.generate(**inputs, **SAMPLING, assistant_model=noisy_copy(model), num_assistant_tokens=3)
        spec = spec[:, inputs["input_ids"].shape[1]:]
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert 0.0 < stats.acceptance_rate < 0.95, stats.acceptance_rate
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], model.config.text_config.vocab_size)
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g}"
