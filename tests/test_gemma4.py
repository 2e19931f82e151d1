"""Gemma 4 / Gemma 4 Unified specifics (transformers >= 5.24; skipped before): what is refused before any work
(audio and video inputs, image-adapter drafts and feature heads), and the prefill's bidirectional image
attention that a ``vlm`` draft must reproduce. The shared matrices over ``testing.FAMILIES`` cover the rest."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_specmm
from hf_specmm import testing
from hf_specmm.errors import IncompatibleDraftError, UnsupportedGenerationError
from conftest import batch_inputs, target
from test_bad_inputs import count_forwards as count_forwards_of

pytestmark = pytest.mark.skipif(not hasattr(transformers, "Gemma4ForConditionalGeneration"),
                                reason="Gemma 4 needs transformers >= 5.24")
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
def test_image_adapter_drafts_and_heads_are_refused_before_any_forward(family):
    model = target(family)
    text = testing.text_draft_from_target(model)
    drafts = {"image_adapter": hf_specmm.ImageAdapterDraft.for_target(model, text)}
    hf_specmm.enable(model)
    try:
        for kind, d in drafts.items():
            for assistant in (d, hf_specmm.Tree(d, top_k=2, depth=2, tokens=4)):
                with count_forwards_of(model) as calls, pytest.raises(IncompatibleDraftError, match=kind):
                    model.generate(**batch_inputs(family, 1), max_new_tokens=4, assistant_model=assistant)
                assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)
    spec = hf_specmm.targets.target_family(model)
    assert {k for k, _ in spec.refused_draft_kinds} == {"image_adapter", "feature_head", "eagle3"}


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
