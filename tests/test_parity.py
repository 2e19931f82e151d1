"""Greedy speculative outputs equal plain generate token for token, for every family, γ, batch and draft."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from conftest import batch_inputs, draft, target

GAMMAS = (1, 3, 5, 8)
BATCHES = (1, 3)
DRAFTS = ("random", "self")


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("kind", DRAFTS)
def test_greedy_parity(family, batch, kind):
    model = target(family)
    inputs = batch_inputs(family, batch)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    hf_specmm.enable(model)
    try:
        for gamma in GAMMAS:
            out = model.generate(**inputs, max_new_tokens=24, do_sample=False,
                                 assistant_model=draft(family, kind), num_assistant_tokens=gamma)
            assert torch.equal(out, plain), f"{family} γ={gamma} batch={batch} {kind}:\n{out}\n!=\n{plain}"
            stats = hf_specmm.last_stats(model)
            assert stats.batch_size == batch and stats.drafted_tokens > 0
            if kind == "self":  # the exact copy must speed something up even with images it cannot see
                assert stats.target_forwards < stats.generated_tokens
    finally:
        hf_specmm.disable(model)


def test_parity_matrix_covers_every_supported_family():
    """Meta-test: a family added to SUPPORTED_TARGETS must be added to the parity matrix too (linear-attention
    hybrids: to tests/test_qwen3_5.py's, over HYBRID_FAMILIES)."""
    from hf_specmm.targets import SUPPORTED_TARGETS

    assert {f.name for f in SUPPORTED_TARGETS.values()} == set(testing.FAMILIES + testing.HYBRID_FAMILIES)
    for family in testing.FAMILIES:
        assert type(target(family)).__name__ in SUPPORTED_TARGETS


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_greedy_parity_with_eos_and_processors(family):
    """Rows stop at EOS at different times; history-dependent processors see each row's own history."""
    # EOS made likely so that the three rows stop at different steps (checked below)
    model = testing.tiny_target(family, seed=3, eos_bias=2.0)
    inputs = batch_inputs(family, 3)
    kwargs = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=2)
    plain = model.generate(**inputs, **kwargs)
    eos = torch.tensor(model.generation_config.eos_token_id).flatten()  # Gemma 3: <eos> and <end_of_turn>
    hf_specmm.enable(model)
    for d in (testing.text_draft_from_target(model), testing.random_text_draft(model)):
        for gamma in (2, 5):
            out = model.generate(**inputs, **kwargs, assistant_model=d, num_assistant_tokens=gamma)
            assert torch.equal(out, plain), f"γ={gamma}\n{out}\n{plain}"
    new = plain[:, inputs["input_ids"].shape[1]:]
    stops = {int(torch.isin(row, eos).nonzero()[0]) for row in new if torch.isin(row, eos).any()}
    assert len(stops) >= 2, f"fixture should make rows stop at EOS at different steps: {new}"
