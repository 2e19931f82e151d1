"""``hf_specmm.Auto``'s estimators and its one decision rule, on numbers: acceptance by depth and rank, each
shape's rate from its own rounds, the round-time model as prior, the UCB choice, whole calls as arms."""

from __future__ import annotations

import pytest

from hf_specmm.auto.acceptance import AcceptanceTable, chain_lengths, tree_nodes
from hf_specmm.auto.budget import EXPLORE, AutoBudget, expected_tokens
from hf_specmm.auto.costs import COLD_ROUNDS, DISCOUNT, PRIOR_ROUNDS, Table
from hf_specmm.auto.shapes import PLAIN, Shape, candidates
from hf_specmm.budget import RoundOutcome
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


def test_a_shapes_rate_comes_from_its_own_rounds_and_cold_rounds_are_not_timed():
    table, chain = Table(), Shape(3)
    theta = table.model()
    for _ in range(COLD_ROUNDS):  # one-time costs of a new width: 10x slower, not timed
        table.record(chain, 1, 3, 10.0)
    assert chain.label not in table.arms
    for _ in range(40):
        table.record(chain, 1, 3, 1.0)
    rate, n = table.rate(chain, 1, 2.0, theta)
    assert n > 30 and rate == pytest.approx(3.0, rel=0.05)  # its own 3 tokens per 1 s, not the prior's


def test_the_round_time_model_is_fitted_to_the_timed_shapes():
    table = Table()
    truth = [0.02, 0.001, 0.004, 0.006]  # plain step, per verified token, per chain step, per tree level
    shapes = [PLAIN, Shape(1), Shape(4), Shape(8), Shape(4, TreeShape(4, 4, 32)), Shape(6, TreeShape(8, 6, 64))]
    for s in shapes:
        for _ in range(COLD_ROUNDS + 30):
            table.record(s, 1, 1, sum(a * b for a, b in zip(truth, s.features())))
    theta = table.model()
    unseen = Shape(3, TreeShape(2, 3, 8))  # never run: predicted by the model
    assert table.predicted_seconds(unseen, theta) == pytest.approx(sum(a * b for a, b in zip(truth, unseen.features())),
                                                                 rel=0.1)


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
    # chain 2 keeps 3 tokens a second; chain 3 4 tokens in 2 s (within EXPLORE of it); chain 1 and plain far worse
    seconds, tokens = {"plain": 1.0, "chain 1": 1.0, "chain 2": 1.0, "chain 3": 2.0}, {"chain 1": 1, "chain 2": 3,
                                                                                     "chain 3": 4}
    taken = run_rounds(budget, clock, seconds, tokens, 600)
    late = taken[300:]
    assert late.count("chain 2") > 0.8 * len(late)
    assert "chain 3" in late  # a near tie is explored again once its evidence fades
    assert late.count("plain") + late.count("chain 1") < 0.02 * len(late)
    assert EXPLORE < (3.0 - 2.0) / 2.0  # (chain 3 runs at 2/3 of chain 2's rate: outside the optimism once known)


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
    table.record_call("speculative", 100, 10.0)
    assert new_budget(clock, shapes, table).runs_plain()  # plain generate never run: once
    table.record_call("plain", 100, 5.0, steps=100)  # twice as fast
    second = new_budget(clock, shapes, table)
    assert second.runs_plain() and second.whole_call["plain_generate"]
    table.calls["plain"] = [PRIOR_ROUNDS, 100, 40.0]  # far slower now
    assert not new_budget(clock, shapes, table).runs_plain()


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
