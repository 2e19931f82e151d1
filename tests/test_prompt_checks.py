"""Right-padded prompts give plain generate's output (the loop continues each row where stock does) or, where
stock's prompt positions are unknown, are refused before any forward; placeholder/image mismatches are
refused before any forward, naming the rows."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from hf_specmm import _compat
from hf_specmm import testing
from hf_specmm.targets import SUPPORTED_TARGETS
from conftest import PROMPTS, batch_inputs, processor, target


def _no_forward(*models):
    def boom(module, args, kwargs):
        raise AssertionError("a forward ran before the error")
    return [m.register_forward_pre_hook(boom, with_kwargs=True) for m in models]


def _refused(model, inputs, match):
    draft = testing.random_text_draft(model)
    hooks = _no_forward(model, draft)
    hf_specmm.enable(model)
    try:
        with pytest.raises(hf_specmm.UnsupportedGenerationError, match=match):
            model.generate(**inputs, assistant_model=draft, max_new_tokens=4)
    finally:
        for h in hooks:
            h.remove()
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_right_padding_gives_plain_generates_output(family):
    """Stock resumes a right-padded row at its last column's position + 1; so does the loop."""
    images = [testing.tiny_image(0), None, testing.tiny_image(2, (64, 32))]
    inputs = testing.make_inputs(family, processor(family), PROMPTS, images, padding_side="right")
    processor(family).tokenizer.padding_side = "left"
    assert not bool(inputs["attention_mask"][:, -1].all()), "fixture should right-pad some row"
    model = target(family)
    if _compat.has_sliding_layers(model.config):  # windows over moved holes cannot match stock: refused
        _refused(model, inputs, r"Rows \[.*\].*padding_side = 'left'")
        return
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    hf_specmm.enable(model)
    try:
        for draft in (testing.text_draft_from_target(model), testing.random_text_draft(model), model):
            for gamma in (1, 4):
                out = model.generate(**inputs, max_new_tokens=12, do_sample=False, assistant_model=draft,
                                     num_assistant_tokens=gamma)
                assert torch.equal(out, plain), (hf_specmm.kind_of(draft).name, gamma)
    finally:
        hf_specmm.disable(model)


def test_right_padding_is_refused_where_stocks_positions_are_unknown(monkeypatch):
    from hf_specmm.targets.positions import PositionRule

    monkeypatch.setattr(PositionRule, "bind", lambda self, *args, **kwargs: self)  # as if stock gave no position_ids
    inputs = testing.make_inputs("llava", processor("llava"), PROMPTS, [testing.tiny_image(0), None, None],
                                 padding_side="right")
    processor("llava").tokenizer.padding_side = "left"
    _refused(target("llava"), inputs, r"Rows \[.*\].*padding_side = 'left'")


def test_left_padding_and_no_mask_pass():
    model = target("llava")
    inputs = batch_inputs("llava", 3)
    hf_specmm.enable(model)
    try:
        model.generate(**inputs, assistant_model=testing.random_text_draft(model), max_new_tokens=3)
        one = batch_inputs("llava", 1)
        model.generate(input_ids=one["input_ids"], pixel_values=one["pixel_values"],
                       assistant_model=testing.random_text_draft(model), max_new_tokens=3)
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_placeholders_without_images(family):
    inputs = dict(batch_inputs(family, 3))
    inputs.pop("pixel_values")
    inputs.pop("image_sizes", None)
    _refused(target(family), inputs, r"placeholders \(row 0: \d+, row 2: \d+\) but no images")


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_images_without_placeholders(family):
    with_images = batch_inputs(family, 3)
    text_only = dict(batch_inputs(family, 3, with_images=False))
    text_only.update({k: v for k, v in with_images.items() if k not in ("input_ids", "attention_mask")})
    _refused(target(family), text_only, r"\d+ image\(s\) were passed but no row")


def test_fixed_size_images_counted_per_row():
    inputs = dict(batch_inputs("llava", 3))
    inputs["pixel_values"] = inputs["pixel_values"][:1]
    inputs["pixel_values"] = torch.cat([inputs["pixel_values"]] * 3)  # 3 images for 2 images' placeholders
    _refused(target("llava"), inputs, r"row 0: 16, row 1: 0, row 2: 16 placeholders \(32 in all\) for 3 image")
    ids = batch_inputs("llava", 3)["input_ids"].clone()
    ids[1, -2] = testing.special_ids()["image"]
    _refused(target("llava"), {**batch_inputs("llava", 3), "input_ids": ids}, r"rows \[0, 1, 2\] cannot hold")


@pytest.mark.parametrize("family", ("llava_next", "llava_onevision"))
def test_anyres_more_placeholder_groups_than_images(family):
    inputs = dict(batch_inputs(family, 3))
    inputs["pixel_values"] = inputs["pixel_values"][:1]
    inputs["image_sizes"] = inputs["image_sizes"][:1]
    _refused(target(family), inputs, r"2 separate image placeholder groups \(row 0: 1 group\(s\)")


ONE_RUN_FAMILIES = [f for f in testing.FAMILIES if target(f).__class__.__name__ in SUPPORTED_TARGETS
                    and SUPPORTED_TARGETS[target(f).__class__.__name__].one_run_per_image]


def _twice(inputs):
    """Row 0's prompt written twice in one row (two placeholder runs) with its one image's inputs."""
    ids = inputs["input_ids"]
    return {k: torch.cat([v, v], 1) if isinstance(v, torch.Tensor) and v.shape == ids.shape else v
            for k, v in inputs.items()}


def test_every_family_with_one_run_per_image_is_checked():
    """All but the tiled Idefics3 / SmolVLM (tiles separated by layout tokens), Step3.7 (a run per crop and one
    for the global view) and Inkling (no input counts its images), LLaVA-1.5 included."""
    assert set(ONE_RUN_FAMILIES) == set(testing.FAMILIES) - {"idefics3", "smolvlm", "step3p7", "inkling"}


@pytest.mark.parametrize("family", ONE_RUN_FAMILIES)
def test_more_placeholder_runs_than_images_refused_before_any_forward(family):
    inputs = _twice(dict(batch_inputs(family, 1)))
    _refused(target(family), inputs, r"2 separate image placeholder groups \(row 0: 2 group\(s\), \d+ placeholders\) "
                                     r"but 1 image\(s\) were passed")


def test_llava_two_placeholder_runs_one_image_would_fail_in_the_forward():
    """LLaVA-1.5: the per-image count is derived from the prompt (32 placeholders for 1 image is a whole
    number of images), so only the run count sees it; transformers itself fails in the prefill."""
    inputs = _twice(dict(batch_inputs("llava", 1)))
    assert int((inputs["input_ids"] == testing.special_ids()["image"]).sum()) == 32
    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        target("llava")(**inputs)
    _refused(target("llava"), inputs, r"row 0: 2 group\(s\), 32 placeholders\) but 1 image\(s\) were passed "
                                      r"\(pixel_values has 1 row\(s\)\)")


def test_qwen_images_counted_by_their_grids():
    """Qwen-VL's pixel_values are patches: images are counted by image_grid_thw (one row per image)."""
    inputs = _twice(dict(batch_inputs("qwen2_vl", 1)))
    assert inputs["pixel_values"].shape[0] > 2 and inputs["image_grid_thw"].shape[0] == 1
    _refused(target("qwen2_vl"), inputs, r"but 1 image\(s\) were passed \(image_grid_thw has 1 row\(s\)\)")
