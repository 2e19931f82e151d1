"""The loop asks the call's budget once per call (``start``) and once per round, at the round's end (``close``, which
returns the next round's budget), with the round's outcome in batch rows even after rows left the caches."""

from __future__ import annotations

import dataclasses

import torch

import hf_specmm
from hf_specmm import testing
from hf_specmm.budget import CallContext, DraftBudget, RoundBudget, RoundOutcome
from hf_specmm.drafts.wrapper import DraftWrapper
from conftest import batch_inputs

KWARGS = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.3)


@dataclasses.dataclass
class CountingBudget(DraftBudget):
    """A fixed budget that records every call the loop makes to it, and what it answered."""

    calls: list = dataclasses.field(default_factory=list)

    def start(self, remaining: list[int], unfinished: list[bool]) -> RoundBudget | None:
        answer = super().start(remaining, unfinished)
        self.calls.append(("start", (list(remaining), list(unfinished)), answer))
        return answer

    def close(self, outcome: RoundOutcome) -> RoundBudget | None:
        answer = super().close(outcome)
        self.calls.append(("close", outcome, answer))
        return answer


class Counted(DraftWrapper):
    """Wraps a draft so that each call runs on a :class:`CountingBudget` (the way ``Tree`` and ``Auto`` build theirs)."""

    wrapped_name = "draft"

    def __init__(self, draft: torch.nn.Module):
        super().__init__()
        self.draft = draft
        self.budgets: list[CountingBudget] = []

    def call_budget(self, budget: DraftBudget, call: CallContext) -> DraftBudget:
        counting = CountingBudget(**{f.name: getattr(budget, f.name) for f in dataclasses.fields(DraftBudget)})
        self.budgets.append(counting)
        return counting


def test_the_loop_calls_the_budget_once_per_call_and_once_per_round():
    model = testing.tiny_target("llava", seed=3, eos_bias=2.0)  # rows stop at EOS at different steps
    inputs = batch_inputs("llava", 3)
    plain = model.generate(**inputs, **KWARGS)
    hf_specmm.enable(model)
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(int(kwargs["attention_mask"].shape[0])), with_kwargs=True)
    try:
        draft = Counted(testing.text_draft_from_target(model))
        out = model.generate(**inputs, **KWARGS, assistant_model=draft, num_assistant_tokens=2,
                             num_assistant_tokens_schedule="heuristic")
        stats = hf_specmm.last_stats(model)
        short = Counted(testing.text_draft_from_target(model))
        model.generate(**inputs, max_new_tokens=1, assistant_model=short)  # the prefill's token ends the call
    finally:
        handle.remove()
        hf_specmm.disable(model)
    assert torch.equal(out, plain)
    assert sizes[0] == 3 and min(sizes) < 3, f"rows must leave the caches for this test: forwards on {sizes} rows"
    (budget,) = draft.budgets
    kinds = [kind for kind, _, _ in budget.calls]
    rounds = len(stats.gammas)
    assert kinds == ["start"] + ["close"] * rounds, kinds  # one call per round, at its end
    answers = [answer for _, _, answer in budget.calls]
    assert [a.gamma for a in answers[:-1]] == stats.gammas and answers[-1] is None
    assert len(set(stats.gammas)) > 1, "the heuristic schedule should move γ in this call"
    outcomes = [outcome for _, outcome, _ in budget.calls[1:]]
    remaining, unfinished = budget.calls[0][1]
    for i, outcome in enumerate(outcomes):
        assert all(len(x) == 3 for x in (outcome.live, outcome.kept, outcome.accepted, outcome.drafted,
                                         outcome.ended, outcome.remaining, outcome.unfinished))  # batch rows
        assert outcome.kept == stats.tokens_per_round[i] and outcome.gamma == stats.gammas[i]
        assert outcome.live == unfinished  # the rows the round ran are those the last answer was for
        assert [r - k for r, k in zip(remaining, outcome.kept)] == outcome.remaining
        remaining, unfinished = outcome.remaining, outcome.unfinished
    assert not any(unfinished) and any(any(o.ended) for o in outcomes)
    (short_budget,) = short.budgets
    assert [kind for kind, _, answer in short_budget.calls] == ["start"] and short_budget.calls[0][2] is None
