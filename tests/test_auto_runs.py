"""The answers' hard tokens (``hf_specmm.auto.runs``): the rounds a chain of γ takes over an answer, recorded from
real calls (rows leaving the caches, rows ending at EOS inside a round), and how a ranking reads them."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import transformers

import hf_specmm
from hf_specmm import testing
from hf_specmm.auto import AcceptanceTable, CostAwarePolicy, chain_lengths
from hf_specmm.trees import TreeShape
from hf_specmm.auto.runs import MIN_ANSWERS, MIN_CALLS, Answer, AnswerBook, AnswerRecorder, expected_rounds
from conftest import batch_inputs
from eagle3_fixtures import lagged_head
from test_sampling import noisy_copy
from test_trees_generate import generate


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def chain_rounds(length: int, hard: set[int], gamma: int) -> int:
    """Rounds of a chain of ``gamma`` over an answer, one token at a time as the loop keeps them."""
    known, rounds = 1, 0
    while known < length:
        drafted = [known + j for j in range(gamma)]
        accepted = next((j for j, token in enumerate(drafted) if token in hard), gamma)
        known += accepted + 1
        rounds += 1
    return rounds


def test_expected_rounds_are_the_rounds_chains_take():
    rng = random.Random(0)
    for _ in range(200):
        length = rng.randint(1, 40)
        hard = {i for i in range(1, length) if rng.random() < 0.25}
        got = expected_rounds(Answer(length, hard), 9, [0.3])  # no unknown token: the rate is not used
        assert got == [float(chain_rounds(length, hard, g)) for g in range(1, 10)], (length, sorted(hard))


def test_unknown_tokens_are_the_expectation_over_their_being_hard():
    rng = random.Random(1)
    for _ in range(30):
        length = rng.randint(2, 14)
        tokens = list(range(1, length))
        hard = {i for i in tokens if rng.random() < 0.2}
        unknown = {i: rng.randint(0, 3) for i in tokens if i not in hard and rng.random() < 0.4}
        misses = [0.15, 0.3, 0.6, 0.45]
        got = expected_rounds(Answer(length, hard, unknown), 5, misses)
        want = [0.0] * 5
        for outcome in itertools.product((False, True), repeat=len(unknown)):
            chance = 1.0
            truly = set(hard)
            for (token, depth), is_hard in zip(unknown.items(), outcome):
                chance *= misses[depth] if is_hard else 1.0 - misses[depth]
                if is_hard:
                    truly.add(token)
            for g in range(1, 6):
                want[g - 1] += chance * chain_rounds(length, truly, g)
        assert got == pytest.approx(want), (length, sorted(hard), unknown)


def test_a_recorded_chain_sees_every_hard_token_it_drafts():
    """A chain of γ0 over an answer records its misses as hard and its full rounds' next tokens as unknown: over
    the recorded answer, chain γ0 takes exactly its rounds whatever the unknown tokens are."""
    rng = random.Random(2)
    for _ in range(100):
        length, g0 = rng.randint(2, 40), rng.randint(1, 8)
        hard = {i for i in range(1, length) if rng.random() < 0.2}
        recorder, known = AnswerRecorder(1), 1
        while known < length:
            accepted = next((j for j in range(g0) if known + j in hard), g0)
            kept = min(accepted + 1, length - known)
            recorder.chain(0, g0, accepted, kept, ended=known + kept >= length)
            known += kept
        answer = recorder.answers[0]
        assert answer.length == length and answer.hard <= hard
        assert all(depth == g0 + 1 and token not in answer.hard for token, depth in answer.unknown.items())
        for rate in (0.0, 0.5, 1.0):
            assert expected_rounds(answer, g0, [rate])[g0 - 1] == chain_rounds(length, hard, g0)


def test_the_book_ranks_answers_one_at_a_time_and_batch_calls_by_their_slowest_row():
    book = AnswerBook(4)
    short, long = Answer(5, {2}), Answer(9, {3, 6})  # 4 and 8 tokens after the first
    for _ in range(MIN_CALLS - 1):
        book.add_call([short, long], [0.1] * 5)
    assert book.chain_tokens(True) is None  # too few calls
    book.add_call([short, long], [0.1] * 5)
    rounds = {a.length: [chain_rounds(a.length, a.hard, g) for g in range(1, 5)] for a in (short, long)}
    # batch: the longest row's tokens over the most rounds a row of the call took
    assert book.chain_tokens(True) == pytest.approx([8 / max(rounds[5][g], rounds[9][g]) for g in range(4)])
    for _ in range(MIN_ANSWERS):
        book.add_call([long], [0.1] * 5)
    n = MIN_CALLS + MIN_ANSWERS
    one_at_a_time = [(MIN_CALLS * (4 + 8) + MIN_ANSWERS * 8) / (MIN_CALLS * rounds[5][g] + n * rounds[9][g])
                     for g in range(4)]
    assert book.chain_tokens(False) == pytest.approx(one_at_a_time)


def test_a_ranking_takes_chains_from_the_book_and_scales_trees_by_it():
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    table = AcceptanceTable(depth=4)
    p = table.probabilities(4, 8)
    accepted = policy._accepted(p)
    book = [1.5, 2.5, 2.6, 3.2]
    got = dict(zip(policy.shapes, policy._from_answers(accepted, p, book)))
    by_table = dict(zip(policy.shapes, accepted))
    chains = chain_lengths(p, 4)
    for shape, value in got.items():
        if shape.tree is not None:  # a tree: the table's value times what the book makes of its depth's chain
            assert value == pytest.approx(by_table[shape] * (book[shape.gamma - 1] - 1) / chains[shape.gamma - 1])
        elif shape.gamma:
            assert value == pytest.approx(book[shape.gamma - 1] - 1)
        else:
            assert value == 0.0
    assert policy._from_answers(accepted, p, None) == accepted  # no book yet: the table's


def _live_rounds(stats, row: int) -> int:
    return sum(1 for per_row in stats.tokens_per_round if per_row[row] > 0)


#: plain steps, chains and trees in turn (a tree's path through a second choice is a hard token too)
MIXED = (0, 3, TreeShape(2, 3, 5), 0, 0, TreeShape(3, 4, 10), 2, 0, 4)


@pytest.mark.parametrize("shapes", ([2], [5], MIXED), ids=("chain2", "chain5", "mixed"))
def test_one_calls_rounds_tell_the_rounds_of_every_chain(shapes, monkeypatch):
    """Batch 3, rows ending at EOS at different rounds (they leave the caches) and inside a round's drafts. A call
    taking ``shapes`` records each row's answer; over it, chain γ takes the rounds that row takes when a call takes
    chain γ: exactly (greedy: the drafter reads whether each token it did not draft was its first choice, so no
    token is unknown), with a partly agreeing draft and with an exact copy. Only plain steps after a row's last
    drafted round stay unknown (nothing reads them): there the rounds lie between those of the two outcomes."""
    model = testing.tiny_target("llava", seed=5, eos_bias=2.0)
    inputs = batch_inputs("llava", 3, with_images=False)
    new = 24
    plain = model.generate(**inputs, max_new_tokens=new, do_sample=False)
    generated = plain[:, inputs["input_ids"].shape[1]:]
    eos = torch.tensor(model.generation_config.eos_token_id).flatten()
    lengths = [next((i + 1 for i, t in enumerate(row) if t in eos), new) for row in generated.tolist()]
    assert len(set(lengths)) > 1 and min(lengths) < new, "rows must end at different lengths for this test"
    calls = []
    add_call = AnswerBook.add_call
    monkeypatch.setattr(AnswerBook, "add_call", lambda book, answers, misses: (calls.append(list(answers)),
                                                                                add_call(book, answers, misses)))
    for d, exact in ((noisy_copy(model, 0.6), False), (testing.text_draft_from_target(model), True)):
        calls.clear()
        out, _ = generate(model, inputs, max_new_tokens=new, assistant_model=hf_specmm.Auto(d, shapes=shapes))
        assert torch.equal(out, plain)
        (answers,) = calls
        assert [a.length for a in answers] == lengths
        if shapes != MIXED:  # (an answer's last token, after a full round that max_length ended, tells nothing)
            assert not any(i < a.length - 1 for a in answers for i in a.unknown)
        took = {}
        for g in range(1, 8):
            out, stats = generate(model, inputs, max_new_tokens=new, assistant_model=hf_specmm.Auto(d, shapes=[g]))
            assert torch.equal(out, plain)
            took[g] = [_live_rounds(stats, row) for row in range(3)]
        for row, answer in enumerate(answers):
            low, high = expected_rounds(answer, 7, [0.0]), expected_rounds(answer, 7, [1.0])
            for g in range(1, 8):
                assert low[g - 1] <= took[g][row] <= high[g - 1], (shapes, row, g, answer)
                if all(i == answer.length - 1 for i in answer.unknown):
                    assert low[g - 1] == high[g - 1] == took[g][row], (shapes, row, g, answer)
        assert any(all(i == a.length - 1 for i in a.unknown) for a in answers)  # exact rows too
        if exact:  # every round but a row's last keeps all its drafts
            assert took[5] == [-(-(n - 1) // 6) for n in lengths] and not any(a.hard for a in answers)
        else:  # the draft misses: rounds the exact copy would not take
            assert any(r > -(-(n - 1) // 6) for r, n in zip(took[5], lengths)) and any(a.hard for a in answers)


@pytest.mark.parametrize("head", ("exact", "eagle3"))
def test_a_feature_head_keeps_its_answers(head):
    """A feature head's misses depend on the token far more than on its depth in the round (the world's heads:
    212 and 140 of their countdowns uncut, 19 and 24 broken): its answers are kept, each round's misses as hard
    tokens; an exact copy of the target misses none."""
    model = testing.tiny_target("llava", seed=5, eos_bias=2.0)
    inputs = batch_inputs("llava", 2, with_images=False)
    draft = testing.feature_head_from_target(model) if head == "exact" else lagged_head(model)
    auto = hf_specmm.Auto(draft, shapes=[3])
    _, stats = generate(model, inputs, max_new_tokens=16, assistant_model=auto)
    book = auto.acceptance(model).answers
    assert len(book.answers) == 2 and len(book.calls) == 1
    if head == "exact":
        assert stats.accepted_tokens == stats.drafted_tokens > 0 and book.compared[0] == 0
    else:  # the rounds that kept fewer than their drafts found hard tokens
        assert 0 < stats.accepted_tokens < stats.drafted_tokens and book.compared[0] > 0


@pytest.mark.skipif(not hasattr(transformers, "MuseGlimmerAssistantModel"), reason="no DFlash drafter class")
def test_a_block_drafter_keeps_no_answers():
    """A DFlash drafter proposes its whole block from one forward: a token's miss depends on its place in the
    block as much as on the token, so no answers are kept and the per-depth table ranks alone."""
    from hf_specmm.drafts.dflash import dflash_draft_for

    model = testing.tiny_target("llava", seed=5, eos_bias=2.0)
    inputs = batch_inputs("llava", 2, with_images=False)
    auto = hf_specmm.Auto(dflash_draft_for(model, block_size=4), shapes=[3])
    generate(model, inputs, max_new_tokens=16, assistant_model=auto)
    book = auto.acceptance(model).answers
    assert not book.answers and not book.calls


def test_every_drafter_that_reads_the_targets_states_says_whether_it_misses_by_token():
    """Drafters that read only tokens obey the law exactly; one that reads the target's states must say itself
    whether its misses follow the token (:attr:`~hf_specmm.drafter.Drafter.misses_by_token`), not inherit it."""
    from hf_specmm.drafter import Drafter
    from hf_specmm.drafts.registry import get_kind

    for name in hf_specmm.draft_kinds():
        drafter = get_kind(name).drafter
        if drafter.observes_verification:
            owner = next(c for c in drafter.__mro__ if "misses_by_token" in vars(c))
            assert owner is not Drafter, f"{name}: {drafter.__name__} inherits Drafter.misses_by_token"
