"""The ``vlm`` draft kind: a VLM of the target's family as ``assistant_model`` sees the images.

Exact copies (and the target itself) must be accepted 100 % on prompts WITH images, which only holds
if the draft reads the same prompt, the same images and the same positions as the target, and its KV
cache is rolled back exactly; noised copies and differently seeded VLMs exercise rejection and
rollback. Every output must equal plain greedy ``generate`` token for token.
"""

from __future__ import annotations

import copy

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from conftest import batch_inputs, target

GAMMAS = (1, 3, 5, 8)


def noised_copy(model, scale: float = 0.5, seed: int = 7):
    """The target with a perturbed LM head: agrees often, not always."""
    return testing.perturb_head(copy.deepcopy(model), scale, seed)


def vlm_draft(family: str, kind: str, model):
    if kind == "self":
        return model
    if kind == "exact":
        return copy.deepcopy(model)
    if kind == "noised":
        return noised_copy(model)
    if kind == "other":
        return testing.tiny_target(family, seed=1)
    raise ValueError(kind)


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("batch", (1, 3))
@pytest.mark.parametrize("kind", ("exact", "noised", "self", "other"))
def test_vlm_draft_greedy_parity(family, batch, kind):
    model = target(family)
    inputs = batch_inputs(family, batch)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    draft = vlm_draft(family, kind, model)
    assert hf_specmm.kind_of(draft).name == "vlm"
    hf_specmm.enable(model)
    try:
        for gamma in GAMMAS:
            out = model.generate(**inputs, max_new_tokens=24, do_sample=False, assistant_model=draft,
                                 num_assistant_tokens=gamma)
            assert torch.equal(out, plain), f"{family} γ={gamma} batch={batch} {kind}:\n{out}\n!=\n{plain}"
            stats = hf_specmm.last_stats(model)
            assert stats.drafted_tokens > 0 and stats.draft_forwards > 0
            if kind in ("exact", "self"):
                assert stats.acceptance_rate == 1.0, (family, gamma, batch, stats.tokens_per_round)
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("batch", (1, 3))
def test_exact_vlm_copy_accepts_everything_with_images(family, batch):
    """Every full round emits γ + 1 tokens on image prompts; forwards counted exactly."""
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)  # no EOS: every row runs the full length
    inputs = batch_inputs(family, batch)  # row 0 and 2 have images of different sizes, row 1 none
    assert "pixel_values" in inputs
    plain = model.generate(**inputs, max_new_tokens=25, do_sample=False)
    hf_specmm.enable(model)
    for gamma in (1, 4):
        out = model.generate(**inputs, max_new_tokens=25, do_sample=False, assistant_model=copy.deepcopy(model),
                             num_assistant_tokens=gamma)
        assert torch.equal(out, plain)
        stats = hf_specmm.last_stats(model)
        assert stats.acceptance_rate == 1.0
        for per_row in stats.tokens_per_round[:-1]:  # the last round is cut by max_new_tokens
            assert per_row == [gamma + 1] * batch, stats.tokens_per_round
        assert stats.target_forwards == (1 + len(stats.tokens_per_round)) * batch
        assert stats.draft_forwards == sum(stats.gammas)


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_draft_vision_tower_runs_once_per_call(family):
    model = target(family)
    draft = copy.deepcopy(model)
    calls = []
    handle = testing.vision_module(draft).register_forward_hook(lambda *a: calls.append(1))
    hf_specmm.enable(model)
    try:
        for batch in (1, 3):
            with torch.no_grad():  # one encoding: what one forward runs (Step3.7: global views, then local crops)
                calls.clear()
                draft(**batch_inputs(family, batch))
                once = len(calls)
            calls.clear()
            model.generate(**batch_inputs(family, batch), max_new_tokens=12, do_sample=False,
                           assistant_model=draft, num_assistant_tokens=3)
            assert len(calls) == once, f"batch {batch}: draft vision tower ran {len(calls)} times, not {once}"
            assert hf_specmm.last_stats(model).draft_forwards > 1
    finally:
        handle.remove()
        hf_specmm.disable(model)


def _forbid_forwards(*models):
    """Forward hooks that fail the test if any of ``models`` runs a forward pass."""
    def boom(module, args, kwargs):
        raise AssertionError(f"{type(module).__name__} ran a forward before the error")

    return [m.register_forward_pre_hook(boom, with_kwargs=True) for m in models]


def _reconfigured(family: str, **changes):
    """A tiny VLM of ``family`` whose config differs from the default target's by ``changes``."""
    model = testing.tiny_target(family, seed=2)
    config = copy.deepcopy(model.config)
    for key, value in changes.items():
        obj = config
        *path, last = key.split(".")
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, value)
    return type(model)._from_config(config, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("family,changes,expect", [
    ("llava", {"image_token_id": testing.special_ids()["video"]}, "placeholder ids"),
    ("llava", {"vision_config.patch_size": 16}, "vision_config.patch_size"),
    ("llava_next", {"image_grid_pinpoints": [[32, 32]]}, "image_grid_pinpoints"),
    ("llava_onevision", {"vision_aspect_ratio": "anyres_max_1"}, "vision_aspect_ratio"),
])
def test_incompatible_vlm_draft_is_refused_before_any_forward(family, changes, expect):
    model = target(family)
    draft = _reconfigured(family, **changes)
    hooks = _forbid_forwards(model, draft)
    hf_specmm.enable(model)
    try:
        with pytest.raises(hf_specmm.IncompatibleDraftError, match=expect) as err:
            model.generate(**batch_inputs(family, 3), max_new_tokens=5, assistant_model=draft)
        assert "hf_specmm.TextOnly(draft)" in str(err.value)
    finally:
        for h in hooks:
            h.remove()
        hf_specmm.disable(model)


def test_vlm_of_another_family_is_refused_and_text_only_opt_out_works():
    model = target("llava")
    draft = target("llava_next")  # same ids and vocabulary, but anyres tiling: other placeholder counts
    inputs = batch_inputs("llava", 3)
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    hooks = _forbid_forwards(model, draft)
    hf_specmm.enable(model)
    try:
        with pytest.raises(hf_specmm.IncompatibleDraftError, match="llava_next vs llava"):
            model.generate(**inputs, max_new_tokens=16, assistant_model=draft)
    finally:
        for h in hooks:
            h.remove()
    try:
        wrapped = hf_specmm.TextOnly(draft)
        assert hf_specmm.kind_of(wrapped).name == "text_only"
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=wrapped)
        assert torch.equal(out, plain)
    finally:
        hf_specmm.disable(model)


def test_text_only_opt_out_of_the_target_itself_is_exact_on_text_prompts():
    """TextOnly(target): the target's LM drafting without the images; on text-only prompts it is exact."""
    model = testing.tiny_target("llava_onevision", seed=0, eos_bias=-30.0)
    inputs = batch_inputs("llava_onevision", 3, with_images=False)
    plain = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    hf_specmm.enable(model)
    out = model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=hf_specmm.TextOnly(model),
                         num_assistant_tokens=4)
    assert torch.equal(out, plain)
    assert hf_specmm.last_stats(model).acceptance_rate == 1.0
    hf_specmm.disable(model)
