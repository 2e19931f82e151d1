"""``return_dict_in_generate`` with every output flag, as transformers' ``GenerationTesterMixin`` checks
assisted decoding (the target as its own assistant and a second random model of the same config,
``eos_token_id=-1``, ``max_new_tokens=4``, two assistant tokens), and as plain ``generate`` returns it
at batch > 1: same output class, same per-step tuple structure and shapes, the same values."""

from __future__ import annotations

import pytest
import torch
from transformers.generation import GenerateDecoderOnlyOutput

import hf_specmm
from hf_specmm import _compat, testing
from conftest import batch_inputs, target

FLAGS = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, output_attentions=True,
             output_hidden_states=True, use_cache=True)


def eager_target(family: str, **kwargs):
    model = testing.tiny_target(family, **kwargs)
    model.set_attn_implementation("eager")  # sdpa returns no attention weights (stock then returns none either)
    return model


def check_mixin_shapes(output, model, batch: int, prompt_len: int) -> None:
    """The shape checks of GenerationTesterMixin._check_generate_outputs (use_cache=True)."""
    text = model.config.get_text_config()
    total = output.sequences.shape[1]
    generated = total - prompt_len
    assert isinstance(output, GenerateDecoderOnlyOutput)
    assert len(output.scores) == generated and all(s.shape == (batch, text.vocab_size) for s in output.scores)
    assert len(output.logits) == generated and all(s.shape == (batch, text.vocab_size) for s in output.logits)
    assert len(output.attentions) == generated and len(output.hidden_states) == generated
    for t, (att, hid) in enumerate(zip(output.attentions, output.hidden_states)):
        queries = prompt_len if t == 0 else 1
        assert [a.shape for a in att] == [(batch, text.num_attention_heads, queries, prompt_len + t)] * len(att)
        assert [h.shape for h in hid] == [(batch, queries, text.hidden_size)] * len(hid)
    head_dim = text.hidden_size // text.num_attention_heads
    for layer in output.past_key_values.layers:
        assert layer.keys.shape == (batch, text.num_key_value_heads, total - 1, head_dim)


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("assistant", ("same", "random"))
def test_mixin_assisted_decoding_matches_greedy_search(family, assistant):
    if _compat.has_sliding_layers(target(family).config):
        pytest.skip("sliding-window target: output_attentions refused (test_sliding_window_target_outputs)")
    model = eager_target(family)
    inputs = batch_inputs(family, 1)
    kwargs = dict(eos_token_id=-1, max_new_tokens=4, num_beams=1, do_sample=False, **FLAGS)
    greedy = model.generate(**inputs, **kwargs)
    draft = model if assistant == "same" else eager_target(family, seed=5)
    draft.generation_config.num_assistant_tokens = 2
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    hf_specmm.enable(model)
    assisted = model.generate(**inputs, **kwargs, assistant_model=draft)
    hf_specmm.disable(model)
    assert torch.equal(assisted.sequences, greedy.sequences)
    for output in (greedy, assisted):
        check_mixin_shapes(output, model, 1, inputs["input_ids"].shape[1])
    for a, b in zip(assisted.scores, greedy.scores):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_mixin_assisted_decoding_sample(family):
    if _compat.has_sliding_layers(target(family).config):
        pytest.skip("sliding-window target: output_attentions refused (test_sliding_window_target_outputs)")
    model = eager_target(family)
    inputs = batch_inputs(family, 1)
    model.generation_config.num_assistant_tokens = 2
    hf_specmm.enable(model)
    torch.manual_seed(0)
    output = model.generate(**inputs, eos_token_id=-1, max_new_tokens=4, do_sample=True, top_k=10,
                            assistant_model=model, **FLAGS)
    hf_specmm.disable(model)
    check_mixin_shapes(output, model, 1, inputs["input_ids"].shape[1])


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_batched_outputs_equal_plain_generate(family):
    """Batch 3, left padding, rows accepting different numbers of drafts (holes in the target cache):
    every tuple has plain generate's structure and values, the cache comes back compacted."""
    if _compat.has_sliding_layers(target(family).config):
        pytest.skip("sliding-window target: see test_sliding_window_target_outputs")
    model = eager_target(family, eos_bias=-30.0)
    inputs = batch_inputs(family, 3)
    kwargs = dict(max_new_tokens=10, do_sample=False, **FLAGS)
    plain = model.generate(**inputs, **kwargs)
    hf_specmm.enable(model)
    for draft in (testing.random_text_draft(model), testing.tiny_target(family, seed=1)):
        out = model.generate(**inputs, **kwargs, assistant_model=draft, num_assistant_tokens=3)
        assert torch.equal(out.sequences, plain.sequences)
        for name in ("scores", "logits"):
            for a, b in zip(getattr(out, name), getattr(plain, name)):
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        for name in ("attentions", "hidden_states"):
            mine, theirs = getattr(out, name), getattr(plain, name)
            assert len(mine) == len(theirs)
            for step_a, step_b in zip(mine, theirs):
                for a, b in zip(step_a, step_b):
                    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        for a, b in zip(out.past_key_values.layers, plain.past_key_values.layers):
            torch.testing.assert_close(a.keys, b.keys, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(a.values, b.values, atol=1e-4, rtol=1e-4)
    hf_specmm.disable(model)


def test_rows_finishing_early_keep_the_structure():
    """Rows stop at EOS at different steps: shapes still as plain generate's, each row's values equal
    up to its end (plain generate runs finished rows on pad tokens; those steps are zeros here)."""
    model = eager_target("llava", seed=3, eos_bias=2.0)
    inputs = batch_inputs("llava", 3)
    kwargs = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=3, **FLAGS)
    plain = model.generate(**inputs, **kwargs)
    hf_specmm.enable(model)
    out = model.generate(**inputs, **kwargs, assistant_model=testing.text_draft_from_target(model))
    hf_specmm.disable(model)
    assert torch.equal(out.sequences, plain.sequences)
    prompt_len = inputs["input_ids"].shape[1]
    eos = model.generation_config.eos_token_id
    new = plain.sequences[:, prompt_len:]
    ends = [int((row == eos).nonzero()[0]) + 1 if (row == eos).any() else new.shape[1] for row in new]
    assert len(set(ends)) > 1, ends
    for name in ("scores", "attentions", "hidden_states"):
        mine, theirs = getattr(out, name), getattr(plain, name)
        assert len(mine) == len(theirs)
        for t, (a, b) in enumerate(zip(mine, theirs)):
            a, b = (a, b) if name == "scores" else (a[0], b[0])
            assert a.shape == b.shape
            for i, end in enumerate(ends):
                if t < end:
                    torch.testing.assert_close(a[i], b[i], atol=1e-4, rtol=1e-4)
                else:
                    assert not a[i].any()


@pytest.mark.parametrize("family", ("gemma3",) + testing.families_of("gemma4"))
def test_sliding_window_target_outputs(family):
    """Gemma 3 / Gemma 4 (sliding-window layers): output_attentions is refused before any work; scores, logits
    and hidden states equal plain generate's; no cache is returned (the loop's has no plain layout)."""
    model = eager_target(family, eos_bias=-30.0)
    inputs = batch_inputs(family, 3)
    hf_specmm.enable(model)
    try:
        with pytest.raises(hf_specmm.UnsupportedGenerationError, match="output_attentions.*sliding-window"):
            model.generate(**inputs, max_new_tokens=4, assistant_model=testing.random_text_draft(model), **FLAGS)
    finally:
        hf_specmm.disable(model)
    flags = {**FLAGS, "output_attentions": False}
    plain = model.generate(**inputs, max_new_tokens=10, do_sample=False, **flags)
    hf_specmm.enable(model)
    out = model.generate(**inputs, max_new_tokens=10, do_sample=False, assistant_model=testing.random_text_draft(model),
                         num_assistant_tokens=3, **flags)
    hf_specmm.disable(model)
    assert torch.equal(out.sequences, plain.sequences) and out.past_key_values is None
    for a, b in zip(out.scores, plain.scores):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for step_a, step_b in zip(out.hidden_states, plain.hidden_states):
        for a, b in zip(step_a, step_b):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
