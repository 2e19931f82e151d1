"""``hf_specmm.Auto``'s estimators and its one decision rule, on numbers: acceptance by depth and rank, each
shape's rate from its own rounds, the round-time model as prior, the UCB choice, whole calls as arms."""

from __future__ import annotations

import json
import math
import random

import pytest

from hf_specmm.auto.acceptance import AcceptanceTable, chain_lengths
from hf_specmm.auto.budget import EXPLORE, REFRESH, AutoBudget, expected_tokens, shape_tokens
from hf_specmm.auto.costs import COLD_ROUNDS, DISCOUNT, PRIOR_ROUNDS, Table, _shape_of
from hf_specmm.auto.shapes import PLAIN, Shape, candidates
from hf_specmm.budget import RoundOutcome
from hf_specmm.simulator import tree_nodes
from hf_specmm.trees import TreeShape


def test_acceptance_counts_hazards_by_depth_and_rank_and_follows_a_drift():
    table = AcceptanceTable(depth=4, ranks=3)
    for _ in range(300):
        table.observe([[(1, 0), (1, 0), (1, None)]])  # a chain: depths 1-2 accepted, depth 3 rejected
    p = table.probabilities(4, 3)
    assert p[0][0] > 0.97 and p[1][0] > 0.97 and p[2][0] < 0.05
    tree = AcceptanceTable(depth=4, ranks=3)
    for _ in range(300):  # the root's 3 children tried, rank 1 taken; that node's 2 children both rejected
        tree.observe([[(3, 1), (2, None)]])
    q = tree.probabilities(2, 3)
    assert q[0][1] > 0.95 and q[0][0] < 0.05 and q[1][0] < 0.05 and q[1][1] < 0.05
    assert tree.trials[0][2] == 0  # rank 2 was never tried: the search stopped at rank 1
    for _ in range(3 * int(1 / (1 - DISCOUNT))):  # the draft stops agreeing: the table follows
        table.observe([[(1, None)]])
    assert table.probabilities(1, 1)[0][0] < 0.1


def test_the_acceptance_counts_discounted_through_their_unit_equal_counts_discounted_every_round():
    rng = random.Random(5)
    rounds = [[[(rng.randint(1, 3), rng.choice([None, 0, 1, 2])) for _ in range(rng.randint(1, 5))]
               for _ in range(rng.randint(1, 4))] for _ in range(1500)]
    ends = [(rng.randint(0, 2), rng.randint(3, 9)) for _ in rounds]
    lazy, early = AcceptanceTable(depth=6, ranks=3), AcceptanceTable(depth=6, ranks=3)
    early.unit = 1e99  # its unit passes the bound within these rounds: counts are brought back to a unit of 1
    hits, trials, ended = [[0.0] * 3 for _ in range(6)], [[0.0] * 3 for _ in range(6)], [0.0, 0.0]
    for paths, (e, t) in zip(rounds, ends):
        lazy.observe(paths, e, t)
        early.observe(paths, e, t)
        for cells in (*hits, *trials, ended):  # the rule as written: every count × DISCOUNT, then this round's
            cells[:] = [v * DISCOUNT for v in cells]
        ended[0], ended[1] = ended[0] + e, ended[1] + t
        for path in paths:
            for d, (tried, taken) in enumerate(path):
                for r in range(min(tried if taken is None else taken + 1, 3)):
                    trials[min(d, 5)][r] += 1.0
                if taken is not None and taken < 3:
                    hits[min(d, 5)][taken] += 1.0
    assert early.unit < 1e99
    for table in (lazy, early):
        for stored, counts in ((table.hits, hits), (table.trials, trials), ([table.ends], [ended])):
            for row, want in zip(stored, counts):
                assert [x / table.unit for x in row] == pytest.approx(want, rel=1e-9, abs=1e-12)
    for row, want in zip(lazy.cut_by_ends(6), early.cut_by_ends(6)):
        assert row == pytest.approx(want, rel=1e-9)


def test_a_depth_barely_seen_takes_the_pooled_hazard_unless_a_profile_gives_its_own():
    table = AcceptanceTable(depth=8, ranks=2)
    for _ in range(20):  # chains of 2, both drafts accepted: depths 3-8 never tried
        table.observe([[(1, 0), (1, 0)]])
    p = table.probabilities(8, 1)
    # the default prior's 0.5 would make a deep chain look worse than it is; the pooled evidence does not
    assert p[0][0] > 0.9 and p[7][0] > 0.9
    profiled = AcceptanceTable(depth=8, ranks=2, prior=[[0.9, 0.0]] * 2 + [[0.2, 0.0]] * 6)
    for _ in range(20):
        profiled.observe([[(1, 0), (1, 0)]])
    # a profile's deep depths (0.2) pull as much as the pooled evidence
    assert profiled.probabilities(8, 1)[7][0] == pytest.approx((0.2 + profiled.probabilities(8, 1)[0][0]) / 2, abs=0.06)


def test_expected_tokens_of_chains_and_trees():
    p = [[0.5, 0.3], [0.5, 0.3]]
    assert chain_lengths(p, 2) == pytest.approx([0.5, 0.75])
    # top_k 2, depth 2, all 2 + 4 nodes: 0.5 + 0.3 + (0.5 + 0.3)·(0.5 + 0.3); the 3 best: 0.5, 0.3, 0.25
    assert sum(v for *_, v in tree_nodes(p, 2, 2, 6)) == pytest.approx(0.8 + 0.8 * 0.8)
    nodes = tree_nodes(p, 2, 2, 3)
    assert [(parent, rank) for parent, rank, _ in nodes] == [(-1, 0), (-1, 1), (0, 0)]
    assert sum(v for *_, v in nodes) == pytest.approx(0.5 + 0.3 + 0.25)
    table = AcceptanceTable(depth=2, ranks=2, prior=p)
    shapes = [PLAIN, Shape(2), Shape(2, TreeShape(2, 2, 6))]
    exp = expected_tokens(table, shapes)
    assert exp[PLAIN] == 1.0 and exp[shapes[1]] == pytest.approx(1 + sum(chain_lengths(table.probabilities(2), 2)[-1:]))


def test_an_answers_end_cuts_a_rounds_later_tokens_as_a_miss_does():
    table = AcceptanceTable(depth=4, ranks=2)
    for _ in range(2000):  # every draft accepted; one answer in ten tokens ends
        table.observe([[(1, 0)] * 4], ends=1, tokens=10)
    p = table.probabilities(4, 1)
    shapes = [Shape(2), Shape(4), Shape(4, TreeShape(2, 4, 8))]
    exp = expected_tokens(table, shapes)
    cut = [[x * 0.9 for x in row] for row in p]
    assert exp[Shape(4)] == pytest.approx(1 + chain_lengths(cut, 4)[-1], rel=1e-3)
    assert exp[Shape(2)] == pytest.approx(1 + 0.9 * p[0][0] + 0.81 * p[0][0] * p[1][0], rel=1e-3)
    # a deeper chain loses more: its share of the uncut expectation falls with depth
    uncut = [1 + chain_lengths(p, g)[-1] for g in (2, 4)]
    assert exp[Shape(4)] / uncut[1] < exp[Shape(2)] / uncut[0] < 1
    assert exp[shapes[2]] < 1 + sum(v for *_, v in tree_nodes(p, 2, 4, 8))


def test_one_expansion_per_top_k_values_every_tree_as_tree_nodes_does():
    rng = random.Random(3)
    for trial in range(20):
        p = []
        for _ in range(rng.randint(1, 9)):
            row, left = [], 1.0
            for _ in range(rng.randint(1, 9)):
                row.append(rng.choice([0.0, rng.random() * left, left / 2]))  # ties and zeros too
                left -= row[-1]
            p.append(row)
        shapes = [s for s in candidates(64, 8) if s.tree is not None]
        exp = expected_tokens(AcceptanceTable(depth=len(p), ranks=9, prior=p), shapes)
        q = AcceptanceTable(depth=len(p), ranks=9, prior=p).probabilities(8)
        for s in shapes:
            want = 1.0 + sum(v for *_, v in tree_nodes(q, s.tree.top_k, s.tree.depth, s.tree.nodes))
            assert exp[s] == pytest.approx(want, rel=1e-12, abs=1e-12), (trial, s.label)
            assert shape_tokens(q, s) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_a_shapes_rate_comes_from_its_own_rounds_and_cold_rounds_are_not_timed():
    table, chain = Table(), Shape(3)
    theta = table.model()
    for _ in range(COLD_ROUNDS):  # one-time costs of a new width: 10x slower, not timed
        table.record(chain, 3, 3, 10.0)
    assert chain.label not in table.arms
    for _ in range(40):
        table.record(chain, 3, 3, 1.0)
    rate, n = table.rates([chain], 1, {chain: 3.0}, theta)[0]
    assert n > 30 and rate == pytest.approx(3.0, rel=0.05)  # 3 expected tokens per its own 1 s, not the prior's
    table.tick(1000)  # the evidence ages: the estimate keeps its value, its weight (and so its optimism) shrinks
    aged, fewer = table.rates([chain], 1, {chain: 3.0}, theta)[0]
    assert aged == pytest.approx(rate) and fewer < 0.01 * n


def test_a_chain_is_valued_by_the_acceptance_table_and_a_tree_by_its_own_kept_over_expected():
    table, chain, tree = Table(), Shape(3), Shape(3, TreeShape(2, 3, 8))
    for _ in range(COLD_ROUNDS + 50):  # both kept half the tokens the table expected of them
        table.record(chain, 2, 4, 1.0)
        table.record(tree, 2, 4, 1.0)
    theta = table.model()
    # a chain's expected tokens are exact under the table: its realised tokens are the table's evidence, not its
    assert table.rates([chain], 1, {chain: 4.0}, theta)[0][0] == pytest.approx(4.0, rel=1e-3)
    # a tree's nodes are the drafter's: its own rounds scale the table's expectation (to near 2 of 4)
    assert table.rates([tree], 1, {tree: 4.0}, theta)[0][0] == pytest.approx(2.0, rel=0.05)


def test_before_any_timed_round_plain_generate_calls_scale_the_round_model():
    table = Table()
    assert table.model()[0] == pytest.approx(1.0)  # nothing known: the prior's unit
    table.record_call("speculative", 10, 9.0)  # a process's first: one-time costs, not timed
    assert "speculative" not in table.calls
    table.record_call("speculative", 10, 0.5)  # half a second outside its (untimed) rounds
    table.record_call("plain", 100, 0.5 + 100 * 0.02, steps=100)  # then 100 steps of 20 ms
    assert table.model()[0] == pytest.approx(0.02, rel=0.05)


def test_the_fits_kept_sums_equal_a_fit_over_every_arm_as_it_is_now():
    """The normal equations are kept as rounds land; the fit equals one from every arm's sums, each weighted by its
    rounds and at least PRIOR_ROUNDS, through arms fading below that weight, coming back and a costs file."""
    def direct(table: Table) -> list[float]:
        gram = [0.0] * 20
        for label, (rounds, prior, *_, seconds) in table.arms.items():
            rounds -= prior  # the fit takes each shape's own rounds
            f, w = _shape_of(label).features, max(rounds, PRIOR_ROUNDS)
            gram = [g + x for g, x in zip(gram, [w * a * b for a in f for b in f] + [w * seconds / rounds * a for a in f])]
        probe = Table()
        probe.arms, probe.gram, probe.faded = table.arms, gram, [0.0] * 20
        return probe.model()

    rng = random.Random(11)
    shapes, table, faded = list(candidates(64, 8)), Table(), 0
    for step in range(3000):
        s = rng.choice(shapes[:6]) if step % 500 < 400 else rng.choice(shapes)  # some shapes fade, then return
        table.record(s, 2.0, 2.0, 0.001 * (1 + s.width / 16) * rng.uniform(0.8, 1.2))
        if step % 250 == 0:
            table.record_call("plain", 100, 0.5, steps=rng.randint(10, 200))  # many rounds' discount at once
        if step % 300 == 299:
            faded += any(v[0] - v[1] < PRIOR_ROUNDS for v in table.arms.values())
            assert table.model() == pytest.approx(direct(table), rel=1e-6)
    assert faded >= 5  # most checks had arms below PRIOR_ROUNDS rounds
    loaded = Table(table.to_json())
    assert loaded.model() == pytest.approx(direct(loaded), rel=1e-6)


def test_the_round_time_model_is_fitted_to_the_timed_shapes():
    table = Table()
    truth = [0.02, 0.001, 0.004, 0.006]  # plain step, per verified token, per chain step, per tree level
    shapes = [PLAIN, Shape(1), Shape(4), Shape(8), Shape(4, TreeShape(4, 4, 32)), Shape(6, TreeShape(8, 6, 64))]
    for s in shapes:
        for _ in range(COLD_ROUNDS + 30):
            table.record(s, 1, 1, sum(a * b for a, b in zip(truth, s.features)))
    theta = table.model()
    unseen = Shape(3, TreeShape(2, 3, 8))  # never run: predicted by the model
    want = sum(a * b for a, b in zip(truth, unseen.features))
    assert table.predicted_seconds(unseen, theta) == pytest.approx(want, rel=0.1)
    table.record_call("plain", 1000, 20.0, steps=1000)  # its steps tick the table: the fit keeps what rounds showed
    assert table.arms["chain 4"][0] < 0.3  # its rounds faded below the prior's
    assert table.predicted_seconds(unseen, table.model()) == pytest.approx(want, rel=0.1)


def test_a_fresh_batch_buckets_prior_takes_another_buckets_proportions():
    one, eight = Table(), Table()
    truth = [0.02, 0.001, 0.008, 0.008]  # one row: draft steps cost 0.4 plain steps, not PRIOR_COSTS' 0.1
    for s in (Shape(2), Shape(6), Shape(4, TreeShape(4, 4, 16))):
        for _ in range(COLD_ROUNDS + 30):
            one.record(s, 1, 1, sum(a * b for a, b in zip(truth, s.features)))
    tree, chain = Shape(8, TreeShape(2, 8, 16)), Shape(4)
    for _ in range(COLD_ROUNDS + 10):  # eight rows: every cost 3x, and only a tree ran
        eight.record(tree, 1, 1, 3 * sum(a * b for a, b in zip(truth, tree.features)))
    want = 3 * sum(a * b for a, b in zip(truth, chain.features))
    assert eight.predicted_seconds(chain, eight.model(one)) == pytest.approx(want, rel=0.1)
    # without it the tree's time is split by PRIOR_COSTS' proportions: the chain's fixed cost is overrated
    assert eight.predicted_seconds(chain, eight.model()) > 1.2 * want
    assert eight.model(one) is not eight.model() and one.model(one) == one.model()  # a table is no base of its own


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_rounds(budget: AutoBudget, clock: Clock, seconds: dict[str, float], tokens: dict[str, int],
               rounds: int) -> list[str]:
    """Rounds of one row whose shapes take ``seconds[label]`` (default 1) and keep ``tokens[label]``."""
    taken = []
    plan = budget.start([1000], [True])
    for _ in range(rounds):
        shape = Shape(plan.gamma, plan.tree)
        taken.append(shape.label)
        clock.now += seconds.get(shape.label, 1.0)
        kept = tokens.get(shape.label, 1)
        plan = budget.close(RoundOutcome(shape.gamma, [True], [kept], [kept - 1], [shape.gamma], [False], [1000],
                                         [True]))
    return taken


def new_budget(clock: Clock, shapes: list[Shape], table: Table | None = None) -> AutoBudget:
    table = table or Table()
    return AutoBudget(shapes, AcceptanceTable(depth=8, ranks=2), lambda rows: ("key", table), 1, clock=clock)


def test_the_rule_takes_the_fastest_shape_and_explores_within_its_uncertainty():
    clock, shapes = Clock(), [PLAIN, Shape(1), Shape(2), Shape(3)]
    budget = new_budget(clock, shapes)
    # every draft is accepted: chain 3 keeps 4 tokens in 1.25 s (3.2 a second), chain 2 3 in 1 s (within EXPLORE of
    # it), chain 1 2 in 1 s and plain 1 in 1 s, far worse
    seconds = {"plain": 1.0, "chain 1": 1.0, "chain 2": 1.0, "chain 3": 1.25}
    taken = run_rounds(budget, clock, seconds, {"chain 1": 2, "chain 2": 3, "chain 3": 4}, 2400)
    late = taken[300:]
    assert late.count("chain 3") > 0.8 * len(late)
    assert "chain 2" in late  # a near tie is explored again once its evidence fades (DISCOUNT: within ~2000 rounds)
    assert late.count("plain") + late.count("chain 1") < 0.02 * len(late)
    assert EXPLORE < (3.2 - 2.0) / 3.2  # (chain 1 runs at 5/8 of chain 3's rate: outside the optimism once known)


def test_cold_first_rounds_do_not_condemn_a_shape():
    """A width's first rounds take 20x (a GPU's one-time costs): the shape is still found best."""
    clock, shapes = Clock(), [PLAIN, Shape(4)]
    budget = new_budget(clock, shapes)
    seen = {"chain 4": 0}

    taken = []
    plan = budget.start([1000], [True])
    for _ in range(200):
        label = Shape(plan.gamma).label
        cold = label == "chain 4" and seen["chain 4"] < COLD_ROUNDS
        seen["chain 4"] += label == "chain 4"
        clock.now += (20.0 if cold else 1.2) if label == "chain 4" else 1.0
        kept = 4 if label == "chain 4" else 1
        taken.append(label)
        plan = budget.close(RoundOutcome(plan.gamma, [True], [kept], [kept - 1], [plan.gamma], [False], [1000], [True]))
    assert taken[100:].count("chain 4") > 90


def test_whole_calls_are_arms_speculative_first_then_plain_once_then_the_faster():
    clock, table = Clock(), Table()
    shapes = [PLAIN, Shape(2)]
    first = new_budget(clock, shapes, table)
    assert not first.runs_plain()  # nothing measured: a speculative call first
    for _ in range(COLD_ROUNDS + 40):  # its chain 2 rounds: 1 s each
        table.record(Shape(2), 2, 2, 1.0)
    table.record_call("speculative", 100, 60.0)  # the process's first: one-time costs, not timed
    assert "speculative" not in table.calls
    assert new_budget(clock, shapes, table).runs_plain()  # plain generate never run: once
    table.record_call("plain", 100, 20.0, steps=100)  # 5 tokens a second
    table.record_call("speculative", 100, 10.0, row_tokens=100)  # 100 tokens a call, 10 s outside the rounds
    second = new_budget(clock, shapes, table)
    assert second.runs_plain()
    # the speculative call as its parts predict it: 100 tokens at chain 2's rate, plus 10 s outside the rounds
    rate = second.scores(table, 1, [Shape(2)])[0][0]
    assert second.whole_call["speculative_rate"] == pytest.approx(100 / (10.0 + 100 / rate))
    assert second.whole_call["speculative_rate"] < second.whole_call["plain_rate"] == pytest.approx(5.0)
    table.calls["plain"] = [PRIOR_ROUNDS, 200, 200.0, 200]  # far slower now: 1 token a second
    assert not new_budget(clock, shapes, table).runs_plain()


def test_a_speculative_call_is_valued_at_the_workloads_mean_call_not_its_own_few():
    """The timed speculative calls were short answers (10 tokens), plain generate's long ones (100): a speculative
    call is predicted for the mean call of either kind, its fixed seconds spread over as many tokens as plain's."""
    clock, table, shapes = Clock(), Table(), [PLAIN, Shape(2)]
    for _ in range(COLD_ROUNDS + 40):
        table.record(Shape(2), 2, 2, 0.1)
    table.record_call("speculative", 10, 5.0)  # the process's first, not timed
    table.record_call("speculative", 10, 1.0, row_tokens=10)  # 1 s outside its rounds
    for _ in range(3):
        table.record_call("plain", 100, 40.0, steps=100)
    budget = new_budget(clock, shapes, table)
    budget.runs_plain()
    rate = budget.scores(table, 1, [Shape(2)])[0][0]
    n_plain, n_spec = table.call_rate("plain")[-1], table.call_rate("speculative")[-1]
    mean = (100 * n_plain + 10 * n_spec) / (n_plain + n_spec)
    assert budget.whole_call["speculative_rate"] == pytest.approx(mean / (1.0 + mean / rate))
    assert budget.whole_call["speculative_rate"] > 10 / (1.0 + 10 / rate) * 2  # not the short calls' rate


def test_a_speculative_call_counts_its_tokens_as_plain_generate_runs_the_same_answers():
    """Plain generate runs a batch's ended rows to the longest one's end: its tokens are rows × the longest answer.
    A speculative call counts the same (its rounds' tokens per live row apart), and is valued in those tokens: a
    batch whose short answers end early is not predicted as if every row ran every round."""
    clock, table = Clock(), Table()
    table.record_call("speculative", 0, 0.0)  # the process's first, not timed
    budget = AutoBudget([Shape(1)], AcceptanceTable(depth=8, ranks=2), lambda rows: ("key", table), 4, clock=clock)
    plan = budget.start([10] * 4, [True] * 4)
    one = [True, False, False, False]  # rows 1-3 end in the first round, row 0 in the second
    for live, kept, left in (([True] * 4, [2, 2, 1, 2], one), (one, [2, 0, 0, 0], [False] * 4)):
        clock.now += 1.0
        ended = [u and not v for u, v in zip(live, left)]
        plan = budget.close(RoundOutcome(1, live, kept, [k - 1 if k else 0 for k in kept], [1] * 4, ended, [8] * 4,
                                         left))
    budget.report()
    # the same answers as plain generate: row 0's 5 new tokens (its prefill's and 4 kept) × 4 rows, 5 steps
    plain = new_budget(clock, [PLAIN, Shape(1)], Table())
    plain.close_plain_call(5, 4)
    plain.report()
    assert table.calls["speculative"][1] == plain.table.calls["plain"][1] == 20
    assert table.calls["speculative"][3] == pytest.approx((1 + 7 / 4 + 2 / 1) * 4)  # per live row, × rows
    # the acceptance learns the answers' ends from the same rounds: 3 of 7 tokens, then 1 of 2
    acceptance = budget.acceptance
    assert [x / acceptance.unit for x in acceptance.ends] == pytest.approx([3 * DISCOUNT + 1, 7 * DISCOUNT + 2])
    # the prediction: the workload's mean call (rows × longest), as many tokens per live row as the rounds made
    table.record_call("plain", 40, 4.0, steps=10)
    whole = AutoBudget([PLAIN, Shape(1)], AcceptanceTable(depth=8, ranks=2), lambda rows: ("key", table), 4, clock=clock)
    whole.runs_plain()
    rate = whole.scores(table, 4, [Shape(1)])[0][0]
    (tokens, _, _, n_plain), (spec, outside, rows, n_spec) = table.call_rate("plain"), table.call_rate("speculative")
    mean = (tokens * n_plain + spec * n_spec) / (n_plain + n_spec)
    assert whole.whole_call["speculative_rate"] == pytest.approx(mean / (outside + mean * rows / spec / rate))
    assert rows / spec == pytest.approx(19 / 20)


def test_a_costs_files_speculative_calls_without_tokens_value_a_call_at_its_best_shapes_rate():
    """A costs file may hold speculative calls whose tokens have faded to 0 (finite numbers >= 0: a valid entry):
    their rounds' share of a call's tokens is then taken as all of them, not divided by zero."""
    table = Table({"calls": {"plain": [1, 10, 1, 10], "speculative": [1, 0, 0, 0]}})
    budget = new_budget(Clock(), [PLAIN, Shape(1)], table)
    assert not budget.runs_plain()
    rate = budget.scores(table, 1, [Shape(1)])[0][0]
    assert budget.whole_call["speculative_rate"] == pytest.approx(rate)


def test_a_whole_call_is_valued_on_the_acceptance_as_it_is_now():
    """Plain calls add no rounds: the expected tokens cached before them are refreshed at each call's start."""
    clock, table, shapes = Clock(), Table(), [PLAIN, Shape(4)]
    budget = new_budget(clock, shapes, table)
    for _ in range(COLD_ROUNDS + 40):
        table.record(Shape(4), 5, 5, 1.0)
    for _ in range(2):  # the process's first is not timed
        table.record_call("speculative", 100, 1.0, row_tokens=100)
    table.record_call("plain", 100, 50.0)
    stale = expected_tokens(budget.acceptance, shapes)[Shape(4)]  # cached on the prior's hazards
    for _ in range(REFRESH // 2):  # fewer rounds than a refresh: every draft accepted
        budget.acceptance.observe([[(1, 0)] * 4])
    budget.runs_plain()
    fresh = expected_tokens(budget.acceptance, shapes)[Shape(4)]
    assert fresh > stale + 1
    assert budget.whole_call["speculative_rate"] == pytest.approx(100 / (1.0 + 100 / (fresh / 1.0)), rel=0.02)


def test_a_round_outcome_reads_each_rows_path():
    outcome = RoundOutcome(3, [True, True, False, True], [4, 2, 0, 2], [3, 1, 0, 3], [3, 3, 0, 3],
                           [False, False, False, True], [9, 11, 0, 0], [True, True, False, False])
    # row 0 took all 3 drafts; row 1 one, the second rejected; row 3 ended after its second draft (kept 2 ≤ 3)
    assert outcome.paths() == [[(1, 0)] * 3, [(1, 0), (1, None)], [(1, 0)] * 2]
    tree = RoundOutcome(2, [True], [2], [1], [5], [False], [9], [True], lambda: [[(2, 1), (3, 0), (0, 0)]])
    assert tree.paths() == [[(2, 1), (3, None)]]


def test_the_grid_and_the_fit_near_max_length():
    grid = candidates(64, 8)
    assert grid[0] == PLAIN and [s.gamma for s in grid[1:9]] == list(range(1, 9))
    assert all(s.width - 1 <= 64 and s.gamma <= 8 for s in grid)
    assert Shape(6, TreeShape(4, 6, 32)).fit(2) == Shape(2, TreeShape(4, 2, 20)) and Shape(5).fit(0) == PLAIN


def test_an_arm_unused_for_thousands_of_rounds_keeps_its_rate_through_a_costs_file():
    """A costs file keeps six significant digits, so an arm whose evidence has faded to a trace is saved with its
    ratios (not its seconds rounded to 0, which divided by zero in the next process); a well-formed entry with no
    seconds is no evidence."""
    table, chain = Table(), Shape(2)
    for _ in range(COLD_ROUNDS + 10):
        table.record(chain, 2, 2, 0.005)
    table.tick(2700)  # its sums are now about 1e-5 of what they were
    before = table.rates([chain], 1, {chain: 2.0}, table.model())[0][0]
    loaded = Table(json.loads(json.dumps(table.to_json())))
    assert loaded.arms[chain.label][4] > 0
    assert loaded.rates([chain], 1, {chain: 2.0}, loaded.model())[0][0] == pytest.approx(before, rel=1e-4)
    empty = Table({"arms": {chain.label: [0.5, 0.0, 1.0, 1.0, 0.0]}})
    assert chain.label not in empty.arms
    assert math.isfinite(empty.rates([chain], 1, {chain: 2.0}, empty.model())[0][0])


def test_a_shape_timed_once_early_is_valued_with_the_round_time_model_as_it_is_now():
    """A shape's prior pseudo-rounds are valued at the round-time model as it is when a rate is asked: a chain
    first timed while only a slow tree had been timed (a model then predicting every chain slow) is not held to
    that prediction once chains are timed."""
    table, tree, seven, eight = Table(), Shape(8, TreeShape(8, 8, 64)), Shape(7), Shape(8)
    for _ in range(COLD_ROUNDS + 20):
        table.record(tree, 5, 5, 0.020)
    for _ in range(COLD_ROUNDS):  # chain 8's width: untimed
        table.record(eight, 7, 7, 0.0056)
    table.record(eight, 7, 7, 0.0056)  # one timed round, then only chain 7's
    for _ in range(COLD_ROUNDS + 60):
        table.record(seven, 6, 6, 0.0055)
    tokens = {seven: 6.2, eight: 6.84}  # chain 8: about 8 % more tokens a second
    (r7, _), (r8, _) = table.rates([seven, eight], 1, tokens, table.model())
    assert r8 > r7
    assert r8 == pytest.approx(6.84 / 0.0056, rel=0.05)
