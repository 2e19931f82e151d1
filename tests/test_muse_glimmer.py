"""Muse Glimmer: what its family reads from a prompt, and what is refused before any
work. (The shared matrices over ``testing.FAMILIES`` run its parity, trees, static caches, sampling and the
draft kinds.)"""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_specmm
from hf_specmm import testing
from hf_specmm.targets import SUPPORTED_TARGETS, target_spec

pytestmark = pytest.mark.skipif(not hasattr(transformers, "MuseGlimmerForConditionalGeneration"),
                                reason="this transformers has no MuseGlimmerForConditionalGeneration")

FAMILY = "muse_glimmer"


def test_registered_only_where_transformers_has_it():
    assert "MuseGlimmerForConditionalGeneration" in SUPPORTED_TARGETS and FAMILY in testing.FAMILIES


def test_placeholders_and_span_markers_by_name():
    from hf_specmm.testing.muse_glimmer import MUSE_LAYOUT

    model, proc = testing.tiny_target(FAMILY), testing.tiny_processor(FAMILY)
    vocab = MUSE_LAYOUT.vocab()
    patch, video = vocab["<|patch|>"], vocab["<|video|>"]
    markers = {vocab[t] for t in ("<|image_start|>", "<|image_end|>", "<|vid_start|>", "<|vid_end|>",
                                  "<|vid_frame_separator|>")}
    assert target_spec(model).dropped_ids == {patch, video}  # without a tokenizer the markers stay text
    assert target_spec(model, proc.tokenizer).dropped_ids == {patch, video} | markers
    inputs = testing.make_inputs(FAMILY, proc, ["describe the image"], [testing.tiny_image(0)])
    ids = inputs["input_ids"][0].tolist()
    start = ids.index(vocab["<|image_start|>"])  # one run per image, between its markers
    assert ids[start + 1:start + 17] == [patch] * 16 and ids[start + 17] == vocab["<|image_end|>"]


def test_text_draft_with_the_tokenizer_never_reads_markers_and_equals_plain():
    model, proc = testing.tiny_target(FAMILY), testing.tiny_processor(FAMILY)
    inputs = testing.make_inputs(FAMILY, proc, ["describe the image", "what color is the circle ?"],
                                 [testing.tiny_image(0), None])
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False, tokenizer=proc.tokenizer,
                             assistant_model=testing.text_draft_from_target(model), num_assistant_tokens=3)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain)


def test_its_dflash_assistant_drafts_losslessly():
    """Its own DFlash assistant class is the ``dflash`` draft kind (tests/test_dflash.py has the matrix)."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    model, proc = testing.tiny_target(FAMILY), testing.tiny_processor(FAMILY)
    cfg = MuseGlimmerAssistantConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, target_layer_ids=[0, 1], block_size=4,
                                     mask_token_id=0)
    assistant = MuseGlimmerAssistantModel(cfg).eval()
    inputs = testing.make_inputs(FAMILY, proc, ["describe the image"], [testing.tiny_image(0)])
    plain = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False, assistant_model=assistant)
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain) and stats.drafted_tokens > 0
