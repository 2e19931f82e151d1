"""``assistant_confidence_threshold`` with stock's meaning, per row: a row whose chosen draft token has
probability below the threshold keeps it and drafts no more this round; the round ends early once
every row has stopped. Lossless whatever the threshold."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from hf_specmm.verifier import greedy_verify, rejection_sample
from conftest import batch_inputs, target


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_threshold_is_lossless_and_shortens_rounds(family):
    model = target(family)
    inputs = batch_inputs(family, 3)
    plain = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    hf_specmm.enable(model)
    try:
        seen = {}
        for threshold in (None, 0.0, 0.3, 1.0):
            draft = testing.text_draft_from_target(model)
            out = model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=draft,
                                 num_assistant_tokens=5, assistant_confidence_threshold=threshold)
            assert torch.equal(out, plain), threshold
            seen[threshold] = hf_specmm.last_stats(model)
        assert seen[0.0].gammas == seen[None].gammas  # nothing is below probability 0
        assert set(seen[1.0].gammas) <= {0, 1}  # every draft is below 1: one draft per round
        assert seen[0.3].draft_forwards < seen[None].draft_forwards
        assert seen[0.3].drafted_tokens < seen[None].drafted_tokens
    finally:
        hf_specmm.disable(model)


def test_threshold_from_the_drafts_generation_config_and_bad_values():
    model = target("llava")
    inputs = batch_inputs("llava", 1)
    draft = testing.text_draft_from_target(model)
    draft.generation_config.assistant_confidence_threshold = 1.0
    hf_specmm.enable(model)
    try:
        model.generate(**inputs, max_new_tokens=8, assistant_model=draft, num_assistant_tokens=4)
        assert set(hf_specmm.last_stats(model).gammas) <= {0, 1}
        with pytest.raises(hf_specmm.UnsupportedGenerationError, match="assistant_confidence_threshold"):
            model.generate(**inputs, max_new_tokens=8, assistant_model=draft, assistant_confidence_threshold=1.5)
    finally:
        hf_specmm.disable(model)


def test_per_row_lengths_in_verification():
    """A row that proposed only its first k drafts accepts at most k, and (sampling) its next token then
    comes from p_k itself: the bonus rule at its own length."""
    drafts = torch.tensor([[5, 6, 7], [5, 6, 7]])
    scores = torch.full((2, 4, 10), -10.0)
    scores[:, 0, 5] = scores[:, 1, 6] = scores[:, 2, 7] = scores[:, 3, 1] = 10.0
    n, emitted = greedy_verify(drafts, scores, lengths=torch.tensor([3, 1]))
    assert n.tolist() == [3, 1] and emitted[1, 1].item() == 6
    p = scores.softmax(-1)
    q = torch.zeros(2, 3, 10)
    q[:, 0, 5] = q[:, 1, 6] = q[:, 2, 7] = 1.0
    counts = torch.zeros(10)
    for seed in range(200):
        n, emitted = rejection_sample(drafts, q, p, generator=torch.Generator().manual_seed(seed),
                                      lengths=torch.tensor([3, 1]))
        assert n.tolist() == [3, 1]
        counts[emitted[1, 1]] += 1
    assert counts[6] == 200  # p_1 puts (almost) all mass on 6: the row's next token is drawn from p_1
