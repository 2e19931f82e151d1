"""Finished rows leave the batch: later rounds run the target and the draft on the unfinished rows only,
and every output and statistic stays what it is with all rows kept."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from conftest import batch_inputs, refused_kind

KWARGS = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=2)


def _run(model, inputs, draft, **extra):
    """Output, stats and the batch size of every target forward."""
    sizes = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(int(kwargs["attention_mask"].shape[0])), with_kwargs=True)
    try:
        out = model.generate(**inputs, **KWARGS, **extra, assistant_model=draft, num_assistant_tokens=3)
    finally:
        handle.remove()
    return out, hf_specmm.last_stats(model), sizes


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_finished_rows_leave_both_batches(family):
    model = testing.tiny_target(family, seed=3, eos_bias=2.0)  # rows stop at EOS at different steps
    inputs = batch_inputs(family, 3)
    plain = model.generate(**inputs, **KWARGS)
    pad = model.generation_config.pad_token_id
    lengths = (plain != pad).sum(-1)
    assert len(set(lengths.tolist())) > 1, "the fixture must stop its rows at different steps"
    hf_specmm.enable(model)
    try:
        drafts = {"text": testing.text_draft_from_target(model)}
        if not refused_kind(family, "feature_head"):
            drafts["feature_head"] = testing.feature_head_from_target(model, noise=0.05)
        for name, draft in drafts.items():
            out, stats, sizes = _run(model, inputs, draft)
            assert torch.equal(out, plain), f"{family} {name}:\n{out}\n!=\n{plain}"
            assert sizes[0] == 3 and sizes[-1] < 3, f"{family} {name}: forwards ran on {sizes} rows"
            assert sizes == sorted(sizes, reverse=True)
            # with every per-step output asked for, all rows stay; same tokens, same rounds, same statistics
            full = model.generate(**inputs, **KWARGS, assistant_model=draft, num_assistant_tokens=3,
                                  return_dict_in_generate=True, output_scores=True)
            assert torch.equal(full.sequences, plain)
            kept_all = dataclasses.asdict(hf_specmm.last_stats(model))
            dropped = dataclasses.asdict(stats)
            for field in ("target_forwards", "draft_forwards", "drafted_tokens", "accepted_tokens",
                          "generated_tokens", "tokens_per_round", "gammas"):
                assert dropped[field] == kept_all[field], f"{family} {name}: {field}"
    finally:
        hf_specmm.disable(model)


def test_rows_leave_the_batch_when_sampling_too():
    """Sampling: rows leave as well, each row's tokens still follow the target (EOS and lengths valid)."""
    model = testing.tiny_target("llava", seed=3, eos_bias=2.0)
    inputs = batch_inputs("llava", 3)
    hf_specmm.enable(model)
    try:
        torch.manual_seed(0)
        sizes = []
        handle = model.register_forward_pre_hook(
            lambda module, args, kwargs: sizes.append(int(kwargs["attention_mask"].shape[0])), with_kwargs=True)
        out = model.generate(**inputs, max_new_tokens=30, do_sample=True, top_k=20,
                             assistant_model=testing.random_text_draft(model), num_assistant_tokens=4)
        handle.remove()
    finally:
        hf_specmm.disable(model)
    assert sizes[0] == 3 and sizes[-1] < 3
    eos, pad = testing.EOS_ID, model.generation_config.pad_token_id
    for row in out[:, inputs["input_ids"].shape[1]:].tolist():  # after a row's EOS: padding only
        if eos in row:
            assert all(t == pad for t in row[row.index(eos) + 1:])


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl", "gemma3"])
def test_rows_leave_the_batch_under_a_confidence_threshold(family):
    """Per-row draft lengths (assistant_confidence_threshold) index the rows still in the caches."""
    model = testing.tiny_target(family, seed=3, eos_bias=2.0)
    inputs = batch_inputs(family, 3)
    plain = model.generate(**inputs, **KWARGS)
    hf_specmm.enable(model)
    try:
        draft = testing.feature_head_from_target(model, noise=0.05)
        out, stats, sizes = _run(model, inputs, draft, assistant_confidence_threshold=0.4)
        _, no_threshold, _ = _run(model, inputs, draft)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain)
    assert sizes[0] == 3 and sizes[-1] < 3, sizes
    # the threshold cut some rows' drafts short: fewer drafted tokens per round than without it
    per_round = lambda st: st.drafted_tokens / len(st.tokens_per_round)  # noqa: E731
    assert per_round(stats) < per_round(no_threshold)
