"""``cache_implementation="static"`` in speculative calls: output equal to plain static-cache ``generate`` (Inkling:
plain dynamic-cache ``generate``), finished rows kept in place, bad combinations refused before any work, and
compiled rounds that do not recompile (one graph per block width, none across further calls with other prompt
lengths)."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from hf_specmm.targets import target_family
from hf_specmm import UnsupportedGenerationError, _compat, testing
from hf_specmm.drafts.feature_head import FeatureHeadDraft
from hf_specmm.drafts.text_only import TextOnly
from conftest import batch_inputs, target

STATIC = dict(do_sample=False, cache_implementation="static")


def _drafts(model):
    """Every draft kind: a text copy (accepted wherever the image does not matter), a random LM, the target
    itself as a same-family VLM draft, a random and an exact feature head, the target's LM as TextOnly."""
    drafts = {"text copy": testing.text_draft_from_target(model), "random": testing.random_text_draft(model),
              "vlm self": model, "text-only self": TextOnly(model)}
    if "feature_head" not in dict(target_family(model).refused_draft_kinds):
        drafts.update({"head exact": testing.feature_head_from_target(model),
                       "head random": FeatureHeadDraft.for_target(model)})
    return drafts


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_static_cache_parity_every_draft_kind(family):
    model = target(family)
    hf_specmm.disable(model)
    # stock's StaticCache shifts the query columns of a model that reads distances off them (Inkling, see
    # docs/stateful-layers.md): its plain generate is the dynamic-cache one
    reference = dict(do_sample=False) if _compat.distances_by_column(model.config) else STATIC
    for batch in (1, 3):
        inputs = batch_inputs(family, batch)
        plain = model.generate(**inputs, max_new_tokens=16, **reference)
        hf_specmm.enable(model)
        try:
            for name, draft in _drafts(model).items():
                out = model.generate(**inputs, max_new_tokens=16, **STATIC, assistant_model=draft, num_assistant_tokens=3)
                assert torch.equal(out, plain), f"{family} batch={batch} {name}:\n{out}\n!=\n{plain}"
                stats = hf_specmm.last_stats(model)
                assert stats.drafted_tokens > 0 and set(stats.gammas) == {3}  # one block width
                if name == "vlm self":  # the target drafting for itself is accepted whole
                    assert stats.acceptance_rate == 1.0
        finally:
            hf_specmm.disable(model)


def test_static_rows_finish_at_different_steps_and_stay_in_place():
    """EOS made likely so that rows stop at different steps: they stay in the batch (masked), output equal."""
    model = testing.tiny_target("llava", seed=3, eos_bias=2.0)
    inputs = batch_inputs("llava", 3)
    kwargs = dict(max_new_tokens=30, repetition_penalty=1.3, **STATIC)
    plain = model.generate(**inputs, **kwargs)
    assert len({int((row == model.generation_config.pad_token_id).sum()) for row in plain}) > 1
    hf_specmm.enable(model)
    for draft in (testing.text_draft_from_target(model), model):
        out = model.generate(**inputs, **kwargs, assistant_model=draft, num_assistant_tokens=4)
        assert torch.equal(out, plain)
    hf_specmm.disable(model)


@pytest.mark.parametrize("option, value, match", [
    ("num_assistant_tokens_schedule", "heuristic", "num_assistant_tokens_schedule"),
    ("assistant_confidence_threshold", 0.4, "assistant_confidence_threshold"),
    ("return_dict_in_generate", True, "return_dict_in_generate"),
    ("cache_implementation", "offloaded", "offloaded"),
])
def test_static_refusals_before_any_forward(option, value, match):
    model = target("llava")
    inputs = batch_inputs("llava", 1)
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    hf_specmm.enable(model)
    try:
        kwargs = {"cache_implementation": "static", option: value}
        with pytest.raises(UnsupportedGenerationError, match=match):
            model.generate(**inputs, max_new_tokens=4, assistant_model=testing.text_draft_from_target(model), **kwargs)
        assert not calls
    finally:
        handle.remove()
        hf_specmm.disable(model)


def test_compiled_rounds_do_not_recompile():
    """Stock's own switch (a static cache + ``compile_config``; on CPU ``_compile_all_devices``): the target's
    verification and the draft's steps run compiled. After one warm-up call, 20 further calls with other
    prompt lengths compile nothing (``last_stats().graphs_compiled``), and outputs equal plain generate's."""
    from transformers import CompileConfig

    model = target("llava")
    draft = testing.text_draft_from_target(model)
    config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
    config._compile_all_devices = True  # stock compiles only on accelerators unless told otherwise
    prompts = ["a cat sits on the mat", "the dog runs", "one two three four five six seven", "red"]
    proc = testing.tiny_processor("llava")
    kwargs = dict(max_new_tokens=8, max_cache_len=96, compile_config=config, **STATIC)  # one cache size: one graph
    hf_specmm.enable(model)
    try:
        warm = testing.make_inputs("llava", proc, prompts[:1], [None])
        model.generate(**warm, **kwargs, assistant_model=draft, num_assistant_tokens=3)
        assert hf_specmm.last_stats(model).graphs_compiled >= 1
        for i in range(20):
            inputs = testing.make_inputs("llava", proc, [prompts[i % len(prompts)] + " x" * (i % 3)], [None])
            out = model.generate(**inputs, **kwargs, assistant_model=draft, num_assistant_tokens=3)
            assert hf_specmm.last_stats(model).graphs_compiled == 0, f"call {i} recompiled"
            if i < 3:
                hf_specmm.disable(model)
                plain = model.generate(**inputs, max_new_tokens=8, **STATIC)
                hf_specmm.enable(model)
                assert torch.equal(out, plain)
        # a feature head hooks the target's modules: its target forward stays eager, its own steps compile
        head = testing.feature_head_from_target(model)
        hf_specmm.disable(model)
        plain = model.generate(**inputs, max_new_tokens=8, **STATIC)
        hf_specmm.enable(model)
        out = model.generate(**inputs, **kwargs, assistant_model=head, num_assistant_tokens=3)
        assert torch.equal(out, plain) and hf_specmm.last_stats(model).acceptance_rate == 1.0
    finally:
        hf_specmm.disable(model)
