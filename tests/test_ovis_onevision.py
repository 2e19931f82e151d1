"""LLaVA-OneVision-1.5 and Ovis2.5 specifics (transformers >= 5.25; nothing is registered before): Ovis2.5's
positions by cache column (plain ``generate`` counts the pad tokens), rows with several images of different
sizes, a video or none, what is refused before any work, χ² sampling, DFlash, ``Auto`` and the training views.
The shared matrices over ``testing.FAMILIES`` run their parity, trees, static caches, heads and draft kinds."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import transformers

import hf_specmm
from hf_specmm import testing
from hf_specmm.errors import UnsupportedGenerationError
from hf_specmm.targets import COLUMNS, ROPE_1D, SUPPORTED_TARGETS, target_spec
from conftest import PROMPTS, batch_inputs, processor, target
from test_bad_inputs import count_forwards

CLASSES = {"llava_onevision1_5": "LlavaOnevision15ForConditionalGeneration",
           "ovis2_5": "Ovis2_5ForConditionalGeneration"}
FAMILIES = tuple(f for f, cls in CLASSES.items() if hasattr(transformers, cls))


def test_registered_only_where_transformers_has_them():
    for family, cls in CLASSES.items():
        present = hasattr(transformers, cls)
        assert (cls in SUPPORTED_TARGETS) == present == (family in testing.FAMILIES) == (family in testing.FIXTURES)



def _rows(family):
    """Row 0: two images of different sizes; row 1: a video; row 2: no image (left-padded)."""
    images = [[testing.tiny_image(0), testing.tiny_image(1, (64, 32))], None, None]
    return testing.make_inputs(family, processor(family), PROMPTS, images, videos=[None, (2, (32, 32), 0), None])


@pytest.mark.parametrize("family", FAMILIES)
def test_spans_dropped_from_a_text_only_view(family):
    model, proc = target(family), processor(family)
    ids = testing.family_ids(family)
    spec = target_spec(model)
    markers = {ids[k] for k in ("image_start", "image_end", "video_start", "video_end")} if family == "ovis2_5" \
        else {ids["vision_start"], ids["vision_end"]}
    assert spec.placeholder_ids == {ids["image"], ids["video"]} and spec.dropped_ids == spec.placeholder_ids | markers
    row = testing.make_inputs(family, proc, ["describe the image"], [testing.tiny_image(0)])["input_ids"][0].tolist()
    start = row.index(ids["image"]) - 1  # one run per image, between its markers
    assert row[start] in markers and row[start + 1:start + 17] == [ids["image"]] * 16 and row[start + 17] in markers


@pytest.mark.parametrize("family", FAMILIES)
def test_images_of_different_sizes_video_and_text_rows_equal_plain(family):
    """Text drafts (exact copy, random), a noised and an exact ``vlm`` copy (it sees images and video: accepted
    100 %), γ 1 and 4."""
    model = target(family)
    inputs = _rows(family)
    assert inputs["pixel_values_videos"].shape[0] > 0 and inputs["image_grid_thw"].shape[0] == 2
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    exact_vlm = copy.deepcopy(model)
    drafts = {"text": testing.text_draft_from_target(model), "random": testing.random_text_draft(model),
              "vlm": testing.perturb_head(copy.deepcopy(model), 0.5), "exact vlm": exact_vlm}
    hf_specmm.enable(model)
    try:
        for name, d in drafts.items():
            for gamma in (1, 4):
                out = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=d,
                                     num_assistant_tokens=gamma)
                assert torch.equal(out, plain), f"{family} {name} γ={gamma}:\n{out}\n!=\n{plain}"
            if name == "exact vlm":
                assert hf_specmm.last_stats(model).acceptance_rate == 1.0
    finally:
        hf_specmm.disable(model)


def test_ovis_positions_count_the_pads_as_plain_generate_does(monkeypatch):
    """Ovis2.5's prepare_inputs_for_generation drops position_ids: plain generate numbers cache columns, pads
    included. The column rule matches it; numbering valid tokens only (the usual 1-D rule) does not."""
    if "ovis2_5" not in FAMILIES:
        pytest.skip("this transformers has no Ovis2.5")
    model = target("ovis2_5")
    inputs = batch_inputs("ovis2_5", 3)
    mask = inputs["attention_mask"]
    bound = COLUMNS.bind(model, inputs["input_ids"], mask)
    assert torch.equal(bound.offset, mask.shape[1] - mask.sum(-1)) and bound.offset.max() > 0
    assert torch.equal(bound.prompt_positions(mask)[0], torch.arange(mask.shape[1]))
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    draft = testing.text_draft_from_target(model)
    family = SUPPORTED_TARGETS["Ovis2_5ForConditionalGeneration"]
    outs = {}
    for rule in (COLUMNS, ROPE_1D):
        monkeypatch.setitem(SUPPORTED_TARGETS, family.class_name, dataclasses.replace(family, positions=rule))
        hf_specmm.enable(model)
        try:
            outs[rule.name] = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=draft,
                                             num_assistant_tokens=3)
        finally:
            hf_specmm.disable(model)
    assert torch.equal(outs["columns"], plain)
    assert not torch.equal(outs["1d"], plain)


@pytest.mark.parametrize("family", FAMILIES)
def test_precomputed_encoder_outputs_are_refused_before_any_forward(family):
    model = target(family)
    inputs = dict(batch_inputs(family, 1))
    with torch.no_grad():
        encoded = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True)
    inputs["mm_encoder_outputs"] = {"image": encoded}
    del inputs["pixel_values"]
    hf_specmm.enable(model)
    try:
        with count_forwards(model) as calls, pytest.raises(UnsupportedGenerationError, match="mm_encoder_outputs"):
            model.generate(**inputs, max_new_tokens=4, assistant_model=testing.text_draft_from_target(model))
        assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["noisy_copy", "noisy_vlm"])
def test_speculative_sampling_matches_plain(family, kind):
    from test_sampling import assert_sampling_matches_plain, noisy_copy
    from test_vlm_draft import noised_copy

    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    draft = noisy_copy(model) if kind == "noisy_copy" else noised_copy(model, scale=0.6)
    assert_sampling_matches_plain(model, family, draft, kind)


@pytest.mark.parametrize("family", FAMILIES)
def test_dflash_greedy_parity(family):
    if not hasattr(transformers, "MuseGlimmerAssistantModel"):
        pytest.skip("this transformers has no DFlash drafter class")
    from test_dflash import test_greedy_parity

    test_greedy_parity(family, 3)  # batch 3: left padding, two image sizes, a text row; chains and a block tree


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_alternating_shapes_every_draft_kind(family):
    from test_auto import test_alternating_shapes_every_draft_kind_equal_plain_and_copies_accept_everything as check

    with torch.no_grad():
        check(family, 3)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind,pool", [("image_adapter", 2), ("vlm", 1)])
def test_training_view_equals_the_inference_path(family, kind, pool, tmp_path):
    """What is trained is what runs (Ovis2.5: the teacher forward numbered by column, as plain generate)."""
    from test_train import test_training_view_equals_the_inference_path as check

    check(family, kind, pool, tmp_path)


def test_bench_heads_see_the_text_drafts_acceptance_pattern_on_ovis():
    """Controlled acceptance on ``tiny-ovis2.5`` at batch 3: a feature head numbers its tokens by the target's
    columns (pads counted), and still sees the pattern the text draft sees (equal τ, acceptance, rounds)."""
    if "ovis2_5" not in FAMILIES:
        pytest.skip("this transformers has no Ovis2.5")
    from hf_specmm.bench import BenchConfig, run_benchmark

    config = BenchConfig(preset="tiny-ovis2.5", gammas=[3], batch_sizes=[3], acceptance=0.7, max_new_tokens=24,
                         repeats=1, warmup=0, draft_kinds=["text_only", "feature_head"])
    text, head = run_benchmark(config, progress=False)["rows"]
    assert 1.0 < text["tau"] < 4.0 and text["lossless"] is True and head["lossless"] is True
    assert (head["tau"], head["acceptance"], head["rounds"]) == (text["tau"], text["acceptance"], text["rounds"])
