"""Image-adapter drafts: lossless across families, γ and batch; a copy of the target's LM with the
target's projector output accepts everything even on prompts WITH images; the vision tower runs once."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from hf_specmm import ImageAdapterDraft, IncompatibleDraftError, testing
from conftest import batch_inputs, skip_refused


def _target(family: str):
    return testing.tiny_target(family, eos_bias=-30.0)  # no EOS: full-length rounds


def adapter_draft(target, kind: str, pool: int = 1) -> ImageAdapterDraft:
    if kind == "self":
        return ImageAdapterDraft.for_target(target, testing.text_draft_from_target(target), copy_projector=True,
                                            image_pool=pool)
    return ImageAdapterDraft.for_target(target, testing.random_text_draft(target), image_pool=pool)


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("batch", (1, 3))
@pytest.mark.parametrize("kind,pool", [("random", 1), ("self", 1), ("self", 3)])
def test_adapter_greedy_parity(family, batch, kind, pool):
    skip_refused(family, "image_adapter")
    model = _target(family)
    inputs = batch_inputs(family, batch)
    plain = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    hf_specmm.enable(model)
    draft = adapter_draft(model, kind, pool)
    for gamma in (1, 3, 5, 8):
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=draft,
                             num_assistant_tokens=gamma)
        assert torch.equal(out, plain), f"{family} batch={batch} {kind} pool={pool} γ={gamma}"


# LLaVA families: the adapter copy reads exactly what the target reads. Qwen-VL targets number image and
# text tokens with 3-D M-RoPE and mark images with vision spans, which a 1-D causal-LM draft reading the
# same embeddings does not reproduce exactly (their adapter parity is tested above; tests/test_qwen_vl.py
# checks the captured embeddings)
@pytest.mark.parametrize("family", testing.LLAVA_FAMILIES)
@pytest.mark.parametrize("batch", (1, 3))
def test_adapter_self_draft_with_images_accepts_everything(family, batch):
    if family == "gemma3":
        pytest.skip("Gemma 3 attends bidirectionally within an image at prefill; the adapter's causal LM does "
                    "not, so its copy is not exact there (the vlm kind is: tests/test_vlm_draft.py)")
    model = _target(family)
    inputs = batch_inputs(family, batch)  # rows with images of different sizes (and one without)
    assert (inputs["input_ids"] == testing.family_ids(family)["image"]).any()
    hf_specmm.enable(model)
    gamma = 4
    out = model.generate(**inputs, max_new_tokens=21, do_sample=False, assistant_model=adapter_draft(model, "self"),
                         num_assistant_tokens=gamma)
    stats = hf_specmm.last_stats(model)
    assert stats.acceptance_rate == 1.0
    assert all(per_row == [gamma + 1] * batch for per_row in stats.tokens_per_round[:-1]), stats.tokens_per_round
    hf_specmm.disable(model)
    assert torch.equal(out, model.generate(**inputs, max_new_tokens=21, do_sample=False))


def test_text_only_copy_is_worse_than_adapter_copy_on_images():
    """The same LM without the image (text-only) must lose acceptance on image prompts: the adapter matters."""
    model = _target("llava")
    inputs = batch_inputs("llava", 3)
    hf_specmm.enable(model)
    model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=testing.text_draft_from_target(model))
    text_only = hf_specmm.last_stats(model).acceptance_rate
    model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=adapter_draft(model, "self"))
    assert hf_specmm.last_stats(model).acceptance_rate == 1.0 > text_only


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("do_sample", (False, True))
def test_vision_tower_runs_once_per_generate_call(family, do_sample):
    skip_refused(family, "image_adapter")
    model = _target(family)
    inputs = batch_inputs(family, 3)
    calls = []
    handle = testing.vision_module(model).register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():  # one encoding: what one forward runs (Step3.7: global views, then local crops)
        model(**inputs)
    once = len(calls)
    hf_specmm.enable(model)
    for _ in range(2):
        calls.clear()
        model.generate(**inputs, max_new_tokens=12, do_sample=do_sample, assistant_model=adapter_draft(model, "random"),
                       num_assistant_tokens=3)
        assert len(calls) == once, f"vision tower ran {len(calls)} times in one generate call, not {once}"
    handle.remove()


def test_adapter_sampling_runs_and_self_draft_is_always_accepted():
    model = _target("llava_next")
    inputs = batch_inputs("llava_next", 3)
    hf_specmm.enable(model)
    out = model.generate(**inputs, max_new_tokens=15, do_sample=True, top_k=20, temperature=0.8,
                         assistant_model=adapter_draft(model, "self"), num_assistant_tokens=3)
    assert out.shape == (3, inputs["input_ids"].shape[1] + 15)
    assert hf_specmm.last_stats(model).acceptance_rate == 1.0  # q == p exactly


def test_adapter_draft_for_another_target_is_refused_before_work():
    llava = _target("llava")
    wrong_id = adapter_draft(llava, "random")
    wrong_id.config.image_token_id = 92  # as if made for a target whose <image> is 92
    hf_specmm.enable(llava)
    calls = []
    handle = llava.register_forward_pre_hook(lambda *args: calls.append(1))
    with pytest.raises(IncompatibleDraftError, match=r"image token id 92.*\[124\]"):
        llava.generate(**batch_inputs("llava", 1), max_new_tokens=5, assistant_model=wrong_id)
    draft = adapter_draft(llava, "random")
    draft.config.image_feature_dim = 48
    with pytest.raises(IncompatibleDraftError, match="width 48.*64 wide"):
        llava.generate(**batch_inputs("llava", 1), max_new_tokens=5, assistant_model=draft)
    assert calls == []
    handle.remove()


def test_copy_projector_needs_equal_widths():
    model = _target("llava")
    with pytest.raises(IncompatibleDraftError, match="hidden size"):
        ImageAdapterDraft.for_target(model, testing.random_text_draft(model), copy_projector=True)


def test_pool_image_features_pools_each_run():
    from hf_specmm.drafts.image_adapter import pool_image_features

    feats = torch.arange(7.0)[:, None]
    pooled = pool_image_features(feats, [4, 3], 2)  # runs [0..3] and [4..6]
    assert pooled.flatten().tolist() == [0.5, 2.5, 4.5, 6.0]
