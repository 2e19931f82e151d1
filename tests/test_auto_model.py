"""``hf_specmm.Auto``'s model of a round, on numbers worked by hand: the cost curves (isotonic in the width, so
a noisy timing at one width is pooled with its neighbours), the realised share of the expected acceptance per
shape, the cost table of a round's live rows, and the ranking shared by a pair's calls."""

from __future__ import annotations

import pytest

from hf_specmm.auto import AcceptanceTable, AutoBudget, CostAwarePolicy, CostTable
from hf_specmm.auto.costs import batch_bucket, isotonic
from hf_specmm.auto.policy import Shape


def test_isotonic_pools_widths_whose_medians_fall():
    # medians 1, 2, 1.5 (weights 1, 1, 2): the last two are pooled to (2 + 2·1.5) / 3
    assert isotonic({1: [1.0], 3: [2.0], 9: [1.4, 1.6]}) == pytest.approx({1: 1.0, 3: 5 / 3, 9: 5 / 3})
    assert isotonic({4: [3.0, 1.0, 2.0], 2: [0.5]}) == {2: 0.5, 4: 2.0}  # medians, in width order
    assert isotonic({}) == {} and isotonic({3: []}) == {}


def test_a_slow_timing_at_one_width_does_not_make_wider_blocks_cheaper():
    table = CostTable()
    for width, seconds in ((1, 1.0), (3, 3.0), (9, 1.2), (9, 1.2), (17, 2.0)):  # width 3 timed under a spike
        table.add("chain", width, None, 0.0, seconds)
    model = table.model()
    times = [model.verify_time("chain", w) for w in (1, 2, 3, 5, 9, 17, 33)]
    assert all(a <= b for a, b in zip(times, times[1:])), times
    assert model.verify_time("chain", 9) == pytest.approx((3.0 + 1.2 + 1.2) / 3)


def flat_costs(step: float = 0.02) -> CostTable:
    """A flat verification (1 s at every width) and a draft step of ``step`` per token or tree level."""
    table = CostTable()
    for kind in ("chain", "tree"):
        for w in (1, 3, 9, 33, 65):
            table.add(kind, w, None, 0.0, 1.0)
    for g in (2, 8):
        table.add("chain", g + 1, f"chain:{g}", step * g, 1.0)
    for k, d in ((2, 4), (4, 6), (8, 6)):
        table.add("tree", 9, f"tree:{k},{d}", step * d, 1.0)
    return table


def test_the_realised_share_of_the_expected_acceptance_steers_the_choice():
    policy = CostAwarePolicy(max_tokens=64, max_depth=8)
    acceptance = AcceptanceTable(depth=8)
    for _ in range(400):
        acceptance.observe_tree([3], [[4, 4, 4, 4]], [[1, 1, 1]])  # only the draft's 2nd choice is ever right
    assert acceptance.yield_of("tree 4,6,24", "tree 4") == 1.0  # no round of it yet
    best = policy.rank(acceptance, flat_costs(), 1)[0]
    assert best.shape.tree is not None and best.accepted > 1
    # its rounds keep a tenth of what the table expects (a draft whose confidence ranks the tree badly)
    for _ in range(50):
        acceptance.observe_yield(best.shape.label, best.shape.family, best.accepted, 0.1 * best.accepted)
    assert acceptance.yield_of(best.shape.label, best.shape.family) == pytest.approx(0.1, abs=0.02)
    family = acceptance.yield_of("tree 9,9,9", best.shape.family)  # never taken: its family's share
    assert 0.1 < family < 0.2
    assert acceptance.yield_of("chain 3", "chain") == 1.0
    again = policy.rank(acceptance, flat_costs(), 1)[0]
    assert again.shape.family != best.shape.family
    assert again.expected_tokens == pytest.approx(1 + again.accepted * acceptance.yield_of(again.shape.label,
                                                                                        again.shape.family))


class Tables:
    """``Auto``'s table look-up by live rows, on a dict, counting look-ups."""

    def __init__(self) -> None:
        self.tables: dict[str, CostTable] = {}

    def __call__(self, rows: int) -> tuple[str, CostTable]:
        key = f"batch<={batch_bucket(rows)}"
        return key, self.tables.setdefault(key, CostTable())


def calibrate(policy: CostAwarePolicy, table: CostTable) -> None:
    for shape in policy.calibration:
        for _ in range(3):
            table.add(shape.kind, shape.width, shape.draft_label, 0.01 * shape.gamma, 0.1 + 0.001 * shape.width)


def test_rounds_are_timed_into_their_live_rows_table_and_chosen_by_a_calibrated_one():
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    _, four = tables(4)
    calibrate(policy, four)
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 4, ())
    samples = sum(len(v) for widths in four.verify.values() for v in widths.values())
    budget.for_round([20] * 4, [True] * 4)
    assert budget.calibration_rounds == 0  # bucket 4 is calibrated
    budget.for_round([20] * 4, [True, False, False, False])  # three rows finished: the live bucket is 1
    budget.for_round([20] * 4, [True, False, False, False])
    _, one = tables(1)
    assert budget.calibration_rounds == 2  # bucket 1 is calibrated by the rounds that reach it
    assert sum(len(v) for widths in four.verify.values() for v in widths.values()) == samples + 1
    assert sum(len(v) for widths in one.verify.values() for v in widths.values()) == 1
    assert set(budget.used) == {"batch<=4", "batch<=1"}
    # where no calibration shape fits the room left (a drafter that cannot take plain steps, one draft of room),
    # the call's calibrated table chooses
    chains_only = CostAwarePolicy(max_tokens=16, max_depth=4, plain=False)
    chain_tables = Tables()
    calibrate(chains_only, chain_tables(4)[1])
    near_end = AutoBudget(chains_only, AcceptanceTable(depth=4), chain_tables, 4, ())
    assert near_end.for_round([2] * 4, [True, False, False, False]).gamma == 1
    assert near_end.calibration_rounds == 0
    # a call that starts at batch 1 calibrates bucket 1's own table
    fresh = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
    fresh.for_round([20], [True])
    assert fresh.calibration_rounds == 1


def test_a_pairs_calls_share_one_ranking_until_it_is_due():
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    ranks = []
    rank = policy.rank
    policy.rank = lambda *args: ranks.append(1) or rank(*args)  # type: ignore[method-assign]
    tables = Tables()
    calibrate(policy, tables(1)[1])
    acceptance = AcceptanceTable(depth=4)
    for call in range(3):  # three short calls of two rounds: one ranking
        budget = AutoBudget(policy, acceptance, tables, 1, ())
        for _ in range(2):
            budget.for_round([20], [True])
    assert len(ranks) == 1
    for _ in range(8):  # the refresh is due
        budget.for_round([20], [True])
    assert len(ranks) == 2
    assert isinstance(budget.ranked[0].shape, Shape)


def test_a_shapes_realised_time_scales_its_prediction_once_it_has_four_rounds():
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    table = CostTable()
    calibrate(policy, table)
    acceptance = AcceptanceTable(depth=4)
    before = {c.shape.label: c for c in policy.rank(acceptance, table, 1)}
    for n in range(4):
        assert table.time_factor("chain 3") == (1.0 if n < 4 else 2.0)
        table.observe_ratio("chain 3", 1.0, 2.0)  # its rounds took twice what the curves predict
    table.observe_ratio("chain 2", 1.0, 100.0)  # one round: no factor yet (and a stalled one is clipped at 4x)
    after = {c.shape.label: c for c in policy.rank(acceptance, table, 1)}
    assert table.time_factor("chain 3") == pytest.approx(2.0) and table.time_factor("chain 2") == 1.0
    assert after["chain 3"].predicted_tokens_per_s == pytest.approx(before["chain 3"].predicted_tokens_per_s / 2)
    assert after["chain 3"].curve_seconds == pytest.approx(before["chain 3"].curve_seconds)
    assert after["chain 2"].predicted_tokens_per_s == pytest.approx(before["chain 2"].predicted_tokens_per_s)
    assert CostTable(table.to_json()).time_factor("chain 3") == pytest.approx(2.0)  # kept in a costs file
