"""A text-only copy of the target's own language model, on prompts without images, is always right:
every draft accepted, every full round emits γ + 1 tokens. Random drafts never exercise acceptance,
rollback or position bookkeeping; this does."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from conftest import batch_inputs, lean_skip


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("batch", (1, 3))
@pytest.mark.parametrize("gamma", (1, 3, 5, 8))
def test_self_draft_accepts_everything(family, batch, gamma):
    lean_skip(family, batch == 3)
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)  # no EOS: every row runs the full length
    inputs = batch_inputs(family, batch, with_images=False)
    plain = model.generate(**inputs, max_new_tokens=25, do_sample=False)
    hf_specmm.enable(model)
    out = model.generate(**inputs, max_new_tokens=25, do_sample=False,
                         assistant_model=testing.text_draft_from_target(model), num_assistant_tokens=gamma)
    assert torch.equal(out, plain)
    stats = hf_specmm.last_stats(model)
    assert stats.acceptance_rate == 1.0
    assert stats.drafted_tokens > 0
    rounds = stats.tokens_per_round
    for per_row in rounds[:-1]:  # the last round is cut by max_new_tokens
        assert per_row == [gamma + 1] * batch, rounds
    assert stats.generated_tokens == 25 * batch
    expected_forwards = 1 + len(rounds)  # prefill + one verification forward per round
    assert stats.target_forwards == expected_forwards * batch
    assert stats.round_block_efficiency == pytest.approx(sum(map(sum, rounds)) / (len(rounds) * batch))
    if 24 % (gamma + 1) == 0:
        assert stats.round_block_efficiency == gamma + 1
