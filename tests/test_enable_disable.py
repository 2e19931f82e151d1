"""enable / disable / is_enabled / last_stats: per-instance patching, exact stock behaviour without a draft and
after disable, SpecStats bookkeeping, the heuristic γ schedule, and dict outputs (scores / logits)."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList, MinLengthLogitsProcessor
from transformers.generation import GenerateDecoderOnlyOutput

import hf_specmm
from hf_specmm import testing
from hf_specmm.errors import SpecMMError
from conftest import batch_inputs

NEW = 16


def _stock_batch_error(model, inputs, d):
    with pytest.raises(ValueError) as info:
        model.generate(**inputs, assistant_model=d, max_new_tokens=4, do_sample=False)
    assert not isinstance(info.value, SpecMMError), f"hf_specmm error from a stock model: {info.value!r}"
    return type(info.value), str(info.value)


def test_enable_returns_model_and_is_idempotent():
    model = testing.tiny_target("llava")
    stock_func = type(model).generate
    assert not hf_specmm.is_enabled(model) and "generate" not in vars(model)
    assert hf_specmm.enable(model) is model
    assert hf_specmm.is_enabled(model)
    func = model.generate.__func__
    assert func is not stock_func and "generate" in vars(model)
    inputs = batch_inputs("llava", 3)
    d = testing.random_text_draft(model, vocab_size=model.config.text_config.vocab_size - 4)
    first = model.generate(**inputs, assistant_model=d, max_new_tokens=NEW, do_sample=False)
    stats = hf_specmm.last_stats(model)
    assert stats is not None

    assert hf_specmm.enable(model) is model  # again: nothing changes
    assert model.generate.__func__ is func, "enable() twice re-wrapped generate"
    assert model.generate.__self__ is model
    assert hf_specmm.last_stats(model) is stats, "enable() twice reset the model's state"
    second = model.generate(**inputs, assistant_model=d, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(first, second)
    plain = type(model).generate(model, **inputs, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(second, plain)
    # the new call's stats are computed once: a double wrap would count the work twice or nest the loop
    again = hf_specmm.last_stats(model)
    assert again is not stats and again.generated_tokens == stats.generated_tokens
    assert again.target_forwards == stats.target_forwards


def test_disable_restores_stock_exactly():
    model = testing.tiny_target("llava")
    never = testing.tiny_target("llava")  # same weights, never enabled
    d = testing.text_draft_from_target(model)  # same vocabulary: stock fails on the batch size only
    inputs = batch_inputs("llava", 3)
    stock_error = _stock_batch_error(never, inputs, d)
    assert "batch" in stock_error[1]

    hf_specmm.enable(model)
    spec = model.generate(**inputs, assistant_model=d, max_new_tokens=NEW, do_sample=False)
    assert hf_specmm.disable(model) is model
    assert "generate" not in vars(model)
    assert not hf_specmm.is_enabled(model)
    assert model.generate.__func__ is type(model).generate
    assert not any(k.startswith("_hf_specmm") for k in vars(model)), "state left on the model"
    with pytest.raises(ValueError, match="enable"):
        hf_specmm.last_stats(model)
    assert _stock_batch_error(model, inputs, d) == stock_error
    plain = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(spec, plain)
    assert hf_specmm.disable(model) is model  # disabling twice (or a never-enabled model) is harmless
    assert hf_specmm.disable(never) is never and "generate" not in vars(never)
    # and it can be enabled again
    hf_specmm.enable(model)
    assert torch.equal(model.generate(**inputs, assistant_model=d, max_new_tokens=NEW, do_sample=False), plain)


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_no_draft_is_stock_generate(family):
    model = testing.tiny_target(family)
    inputs = batch_inputs(family, 3)
    stock_greedy = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    torch.manual_seed(123)
    stock_sample = model.generate(**inputs, max_new_tokens=NEW, do_sample=True, top_k=0, temperature=1.3)
    stock_dict = model.generate(**inputs, max_new_tokens=4, do_sample=False, return_dict_in_generate=True,
                                output_scores=True)

    hf_specmm.enable(model)
    assert torch.equal(model.generate(**inputs, max_new_tokens=NEW, do_sample=False), stock_greedy)
    assert torch.equal(model.generate(**inputs, max_new_tokens=NEW, do_sample=False, assistant_model=None),
                       stock_greedy)
    torch.manual_seed(123)
    sample = model.generate(**inputs, max_new_tokens=NEW, do_sample=True, top_k=0, temperature=1.3)
    assert torch.equal(sample, stock_sample)
    assert not torch.equal(sample, stock_greedy), "fixture: sampling should differ from greedy"
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False, return_dict_in_generate=True,
                         output_scores=True)
    assert type(out) is type(stock_dict)
    assert out.past_key_values is not None  # stock's own output, not hf_specmm's
    assert torch.equal(out.sequences, stock_dict.sequences)
    assert all(torch.equal(a, b) for a, b in zip(out.scores, stock_dict.scores))
    assert hf_specmm.last_stats(model) is None, "a call without a draft must not produce stats"


def test_no_draft_positional_arguments_are_stock():
    """generate(inputs, generation_config, logits_processor, ...) keeps stock's positional order when enabled."""
    model = testing.tiny_target("llava")
    inputs = dict(batch_inputs("llava", 1))
    ids = inputs.pop("input_ids")
    eos = model.generation_config.eos_token_id
    processors = LogitsProcessorList([MinLengthLogitsProcessor(ids.shape[1] + 8, eos)])
    stock = model.generate(ids, None, processors, **inputs, max_new_tokens=NEW, do_sample=False)
    hf_specmm.enable(model)
    out = model.generate(ids, None, processors, **inputs, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(out, stock)


def test_enabling_one_instance_leaves_another_alone():
    a, b = testing.tiny_target("llava"), testing.tiny_target("llava")
    d = testing.text_draft_from_target(b)
    inputs = batch_inputs("llava", 3)
    stock_error = _stock_batch_error(b, inputs, d)
    stock_func = type(a).generate
    hf_specmm.enable(a)
    assert hf_specmm.is_enabled(a) and not hf_specmm.is_enabled(b)
    assert "generate" not in vars(b) and b.generate.__func__ is type(b).generate
    assert type(a).generate is stock_func, "enable() patched the class"
    assert _stock_batch_error(b, inputs, d) == stock_error
    with pytest.raises(ValueError, match="enable"):
        hf_specmm.last_stats(b)
    out = a.generate(**inputs, assistant_model=d, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(out, b.generate(**inputs, max_new_tokens=NEW, do_sample=False))
    hf_specmm.disable(b)  # disabling B leaves A enabled
    assert hf_specmm.is_enabled(a) and "generate" in vars(a)


def test_last_stats_lifecycle():
    model = testing.tiny_target("llava")
    with pytest.raises(ValueError) as info:
        hf_specmm.last_stats(model)
    assert "hf_specmm.enable" in str(info.value)
    hf_specmm.enable(model)
    assert hf_specmm.last_stats(model) is None
    inputs = batch_inputs("llava", 1)
    model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert hf_specmm.last_stats(model) is None
    d = testing.random_text_draft(model)
    model.generate(**inputs, assistant_model=d, max_new_tokens=4, do_sample=False)
    first = hf_specmm.last_stats(model)
    assert isinstance(first, hf_specmm.SpecStats) and first.generated_tokens == 4
    model.generate(**inputs, assistant_model=d, max_new_tokens=6, do_sample=False)
    second = hf_specmm.last_stats(model)
    assert second is not first and second.generated_tokens == 6 and first.generated_tokens == 4
    model.generate(**inputs, max_new_tokens=4, do_sample=False)  # a call without a draft keeps the last stats
    assert hf_specmm.last_stats(model) is second


def test_acceptance_is_none_when_nothing_was_drafted():
    """max_new_tokens=1: the prefill writes the only token, no draft is proposed; 0 of 0 is not 0.0 or 1.0."""
    model = hf_specmm.enable(testing.tiny_target("llava", eos_bias=-30.0))
    inputs = batch_inputs("llava", 3)
    model.generate(**inputs, assistant_model=testing.text_draft_from_target(model), max_new_tokens=1)
    s = hf_specmm.last_stats(model)
    assert s.generated_tokens == 3 and s.drafted_tokens == 0
    assert s.acceptance_rate is None and s.as_dict()["acceptance_rate"] is None
    model.generate(**inputs, assistant_model=testing.text_draft_from_target(model), max_new_tokens=3)
    assert hf_specmm.last_stats(model).drafted_tokens > 0 and hf_specmm.last_stats(model).acceptance_rate == 1.0


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("kind", ("random", "self"))
def test_stats_are_consistent(family, kind):
    model = hf_specmm.enable(testing.tiny_target(family, eos_bias=-30.0))  # no EOS: every row runs to NEW
    d = testing.text_draft_from_target(model) if kind == "self" else testing.random_text_draft(
        model, vocab_size=model.config.text_config.vocab_size - 4)
    inputs = batch_inputs(family, 3)
    out = model.generate(**inputs, assistant_model=d, max_new_tokens=NEW, do_sample=False, num_assistant_tokens=3)
    s = hf_specmm.last_stats(model)
    new = out[:, inputs["input_ids"].shape[1]:]
    pad = model.generation_config.pad_token_id
    assert new.shape == (3, NEW)
    assert s.generated_tokens == int((new != pad).sum()) == 3 * NEW
    assert s.batch_size == 3 and s.gamma == 3
    assert s.block_efficiency == pytest.approx(s.generated_tokens / s.target_forwards)
    assert 0.0 <= s.acceptance_rate <= 1.0
    assert s.acceptance_rate == pytest.approx(s.accepted_tokens / s.drafted_tokens)
    assert 0 <= s.accepted_tokens <= s.drafted_tokens
    assert s.wall_time_s > 0 and s.tokens_per_s > 0
    assert s.tokens_per_s == pytest.approx(s.generated_tokens / s.wall_time_s)
    # one token per row from the prefill, the rest from the rounds
    assert s.generated_tokens == 3 + sum(map(sum, s.tokens_per_round))
    assert len(s.gammas) == len(s.tokens_per_round) and s.draft_forwards == sum(s.gammas)
    assert all(len(r) == 3 for r in s.tokens_per_round)
    # prefill (one per row) + one verification per round for each row still running (a running row emits >= 1)
    assert s.target_forwards == 3 + sum(n > 0 for r in s.tokens_per_round for n in r)
    finished = [False] * 3
    for r in s.tokens_per_round:  # once a row stops it stays stopped
        assert not any(f and n for f, n in zip(finished, r)), s.tokens_per_round
        finished = [f or n == 0 for f, n in zip(finished, r)]
    assert all(0 <= n <= g + 1 for r, g in zip(s.tokens_per_round, s.gammas) for n in r)
    running = [n for r in s.tokens_per_round for n in r if n > 0]
    assert s.round_block_efficiency == pytest.approx(sum(running) / len(running))
    if kind == "self":
        assert s.accepted_tokens > 0 and s.block_efficiency > 1
    d = s.as_dict()
    for key in ("batch_size", "gamma", "target_forwards", "draft_forwards", "drafted_tokens", "accepted_tokens",
                "generated_tokens", "wall_time_s", "block_efficiency", "round_block_efficiency", "acceptance_rate",
                "tokens_per_s"):
        assert d[key] == pytest.approx(getattr(s, key))


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_heuristic_schedule(family):
    model = hf_specmm.enable(testing.tiny_target(family, eos_bias=-30.0))
    inputs = batch_inputs(family, 1, with_images=False)
    plain = type(model).generate(model, **inputs, max_new_tokens=30, do_sample=False)
    kw = dict(max_new_tokens=30, do_sample=False, num_assistant_tokens=2, num_assistant_tokens_schedule="heuristic")

    d = testing.text_draft_from_target(model)  # always right: +2 per round
    out = model.generate(**inputs, assistant_model=d, **kw)
    assert torch.equal(out, plain)
    s = hf_specmm.last_stats(model)
    assert s.gamma == 2 and s.acceptance_rate == 1.0
    assert s.gammas[:3] == [2, 4, 6], s.gammas
    assert len(set(s.gammas)) > 1
    # as stock: "heuristic" writes the final γ back to the draft's generation_config ...
    assert d.generation_config.num_assistant_tokens == 2 + 2 * len(s.gammas)  # +2 after each (full) round
    out = model.generate(**inputs, assistant_model=d, **kw)  # ... a generate kwarg still wins next call
    assert torch.equal(out, plain) and hf_specmm.last_stats(model).gammas == s.gammas
    fresh = testing.text_draft_from_target(model)  # ... "heuristic_transient" restarts and writes nothing
    out = model.generate(**inputs, assistant_model=fresh, **{**kw, "num_assistant_tokens_schedule": "heuristic_transient"})
    assert torch.equal(out, plain) and hf_specmm.last_stats(model).gammas == s.gammas
    assert fresh.generation_config.num_assistant_tokens is None, "heuristic_transient modified the draft's config"

    bad = testing.random_text_draft(model)  # always wrong: -1 per round, never below 1
    kw["num_assistant_tokens"] = 4
    out = model.generate(**inputs, assistant_model=bad, **kw)
    assert torch.equal(out, plain)
    s = hf_specmm.last_stats(model)
    assert s.acceptance_rate < 0.2
    assert s.gammas[:6] == [4, 3, 2, 1, 1, 1], s.gammas

    constant = model.generate(**inputs, assistant_model=d, max_new_tokens=30, do_sample=False,
                              num_assistant_tokens=2)
    assert torch.equal(constant, plain) and set(hf_specmm.last_stats(model).gammas[:-1]) == {2}


def _dict_outputs(model, inputs, **kw):
    kw = dict(max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True, output_scores=True,
              output_logits=True, **kw)
    plain = type(model).generate(model, **inputs, **kw)
    return kw, plain


def _assert_steps_close(ours, theirs, what):
    assert ours is not None and len(ours) == len(theirs), f"{what}: {None if ours is None else len(ours)} steps"
    for t, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, f"{what} step {t}: {a.shape} != {b.shape}"
        assert torch.allclose(a.float(), b.float(), atol=1e-4), f"{what} step {t}: max diff {(a - b).abs().max()}"


@pytest.mark.parametrize("kind", ("random", "self"))
def test_dict_output_scores_and_logits_batch1(kind):
    model = hf_specmm.enable(testing.tiny_target("llava"))
    d = testing.text_draft_from_target(model) if kind == "self" else testing.random_text_draft(model)
    inputs = batch_inputs("llava", 1)
    # repetition_penalty makes processed scores differ from raw logits
    kw, plain = _dict_outputs(model, inputs, repetition_penalty=1.3)
    out = model.generate(**inputs, assistant_model=d, **kw)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, plain.sequences)
    assert not torch.allclose(plain.scores[1], plain.logits[1]), "fixture: scores should differ from logits"
    _assert_steps_close(out.scores, plain.scores, "scores")
    _assert_steps_close(out.logits, plain.logits, "logits")
    plain_seq = type(model).generate(model, **inputs, max_new_tokens=NEW, do_sample=False, repetition_penalty=1.3)
    assert torch.equal(out.sequences, plain_seq)


def test_dict_output_scores_batch3_without_eos():
    model = hf_specmm.enable(testing.tiny_target("llava", eos_bias=-30.0))
    d = testing.random_text_draft(model, vocab_size=model.config.text_config.vocab_size - 4)
    inputs = batch_inputs("llava", 3)
    kw, plain = _dict_outputs(model, inputs)
    out = model.generate(**inputs, assistant_model=d, num_assistant_tokens=3, **kw)
    assert torch.equal(out.sequences, plain.sequences)
    _assert_steps_close(out.scores, plain.scores, "scores")
    _assert_steps_close(out.logits, plain.logits, "logits")
