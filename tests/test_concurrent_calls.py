"""Concurrent ``generate`` calls on one enabled target: every draft kind that hooks the target's modules (feature
heads EAGLE-1 / EAGLE-3, DFlash, Gemma 4 assistants, image adapters, the linear-attention state capture of a
Qwen3.5 target) gives each call the output and the rounds it gives alone.

Deterministic interleaving: call A stops inside one of its target forwards (its hooks registered, its capture
half done) while call B runs from start to end on another thread, then A resumes."""

from __future__ import annotations

import threading

import pytest
import torch

import hf_specmm
from hf_specmm import _compat, testing
from hf_specmm.hooks import this_call

from conftest import PROMPTS  # noqa: F401  (conftest's settings: one torch thread, offline)
from eagle3_fixtures import lagged_head

NEW_TOKENS = 10


def _inputs(family: str, row: int, image: bool):
    processor = testing.tiny_processor(family)
    prompts = ["describe the image", "what color is the sky and the tree ?"]
    return testing.make_inputs(family, processor, [prompts[row]], [testing.tiny_image(row) if image else None])


def _call(model, inputs, draft):
    out = model.generate(**inputs, assistant_model=draft, max_new_tokens=NEW_TOKENS, do_sample=False)
    return out, hf_specmm.last_stats(model).tokens_per_round


def assert_interleaved_calls_match_sequential(model, draft, pause_module, hit: int, image: bool = False,
                                              family: str = "llava"):
    """A pauses at its ``hit``-th pass through ``pause_module`` (on its own thread); B runs whole meanwhile."""
    a, b = _inputs(family, 0, image), _inputs(family, 1, image)
    hf_specmm.enable(model)
    try:
        alone = [_call(model, a, draft), _call(model, b, draft)]
        main, seen, results = threading.get_ident(), [0], {}

        def run_b() -> None:
            try:
                results["b"] = _call(model, b, draft)
            except Exception as error:  # reported below, with A's outcome
                results["b"] = error

        def pause(module, args, output) -> None:
            if threading.get_ident() != main:
                return
            seen[0] += 1
            if seen[0] == hit:
                other = threading.Thread(target=run_b)
                other.start()
                other.join()

        handle = pause_module.register_forward_hook(pause)
        try:
            results["a"] = _call(model, a, draft)
        finally:
            handle.remove()
    finally:
        hf_specmm.disable(model)
    assert seen[0] >= hit and "b" in results, "call B never ran inside call A"
    assert not isinstance(results["b"], Exception), f"call B raised {results['b']!r}"
    for name, (out, rounds), (out_alone, rounds_alone) in zip("ab", (results["a"], results["b"]), alone):
        assert torch.equal(out, out_alone), f"call {name}: {out} != {out_alone}"
        assert rounds == rounds_alone, f"call {name}'s rounds {rounds} != {rounds_alone} alone"


def _lm_head(model):
    return model.get_output_embeddings()  # runs after the decoder: the capture is done, not yet read


@pytest.mark.parametrize("hit", (1, 2))  # inside the prefill, inside the first verification forward
def test_feature_head(hit):
    model = testing.tiny_target("llava", eos_bias=-30.0)
    draft = testing.feature_head_from_target(model)
    hidden = draft.fc.out_features
    with torch.no_grad():  # the features count too: drafts read from the wrong call's features differ
        draft.fc.weight[:, hidden:] = 0.1 * torch.eye(hidden)
    assert_interleaved_calls_match_sequential(model, draft, _lm_head(model), hit)


@pytest.mark.parametrize("hit", (1, 2))
def test_eagle3_head(hit):
    model = testing.tiny_target("llava", eos_bias=-30.0)
    assert_interleaved_calls_match_sequential(model, lagged_head(model), _lm_head(model), hit)


@pytest.mark.parametrize("hit", (1, 2))
def test_eagle3_head_inside_the_decoder(hit):
    """Paused between two captured layers: B's forward must not add to (or clear) A's half-captured layers."""
    model = testing.tiny_target("llava", eos_bias=-30.0)
    layers = model.get_decoder().layers
    assert_interleaved_calls_match_sequential(model, lagged_head(model), layers[len(layers) // 2], hit)


@pytest.mark.parametrize("hit", (1, 2))
def test_dflash(hit):
    from hf_specmm.drafts.dflash import dflash_draft_for

    model = testing.tiny_target("llava", eos_bias=-30.0)
    draft = dflash_draft_for(model, block_size=4)
    assert_interleaved_calls_match_sequential(model, draft, model.get_decoder().layers[-1], hit)


@pytest.mark.skipif(not _compat.GEMMA4_SUPPORTED, reason="Gemma 4 assistants need transformers >= 5.24")
def test_gemma4_assistant():
    from hf_specmm.drafts.gemma4_assistant import tiny_assistant

    model = testing.tiny_target("gemma4", eos_bias=-30.0)
    assert_interleaved_calls_match_sequential(model, tiny_assistant(model), _lm_head(model), 2, family="gemma4")


def test_image_adapter():
    """Paused before the decoder reads the prompt's embeddings: B's prefill must not become A's images."""
    model = testing.tiny_target("llava", eos_bias=-30.0)
    draft = hf_specmm.ImageAdapterDraft.for_target(model, testing.text_draft_from_target(model), copy_projector=True)
    assert_interleaved_calls_match_sequential(model, draft, model.get_input_embeddings(), 1, image=True)


@pytest.mark.skipif(not testing.HYBRID_FAMILIES, reason="this transformers has no Qwen3.5")
@pytest.mark.parametrize("hit", (2, 3))  # the first verification forwards (the prefill's are not captured)
def test_qwen3_5_linear_states(hit):
    """Paused inside a linear-attention layer of the target (its projections half captured): B's projections
    must not join A's replay, nor A's layer end at B's."""
    model = testing.tiny_target("qwen3_5", eos_bias=-30.0)
    layer = _compat.gated_delta_modules(model)
    first = layer[min(layer)]
    assert_interleaved_calls_match_sequential(model, testing.text_draft_from_target(model), first.in_proj_qkv, hit,
                                              family="qwen3_5")


def test_a_calls_hook_runs_only_on_its_thread():
    calls = []
    hook = this_call(lambda *args: calls.append(threading.get_ident()))
    hook(1)
    other = threading.Thread(target=hook, args=(2,))
    other.start()
    other.join()
    assert calls == [threading.get_ident()]
