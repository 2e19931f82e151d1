"""``hf_specmm.Auto``'s model of a round, on numbers worked by hand: the cost curves (isotonic in the width, so
a noisy timing at one width is pooled with its neighbours), the realised share of the expected acceptance per
shape, the cost table of a round's live rows, and the ranking shared by a pair's calls."""

from __future__ import annotations

import pytest

from hf_specmm.auto import AcceptanceTable, AutoBudget, CostAwarePolicy, CostTable
from hf_specmm.auto.costs import isotonic
from hf_specmm.auto.store import batch_bucket
from hf_specmm.auto.policy import Choice, Shape


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
    assert acceptance.yield_of("tree 4") == 1.0  # no round of any family yet
    best = policy.rank(acceptance, flat_costs(), 1)[0]
    assert best.shape.tree is not None and best.accepted > 1
    acceptance.observe_yield("chain", 200.0, 200.0)  # chains keep what the table expects
    # the best shape's rounds keep a tenth of it (a draft whose confidence ranks the tree badly)
    for _ in range(50):
        acceptance.observe_yield(best.shape.family, best.accepted, 0.1 * best.accepted)
    pooled = acceptance.pooled_yield()
    assert acceptance.yield_of(best.shape.family) < 0.4 < pooled < acceptance.yield_of("chain")
    unseen = next(f for f in ("tree 2", "tree 4", "tree 8") if f != best.shape.family)
    assert acceptance.yield_of(unseen) == pytest.approx(pooled)  # a family without rounds: the pooled share
    again = policy.rank(acceptance, flat_costs(), 1)[0]
    assert again.shape.family != best.shape.family
    assert again.expected_tokens == pytest.approx(1 + again.accepted * acceptance.yield_of(again.shape.family))


def test_a_family_known_from_few_rounds_keeps_near_the_pooled_share():
    acceptance = AcceptanceTable(depth=8)
    acceptance.observe_yield("chain", 200.0, 180.0)  # many rounds at 0.9
    acceptance.observe_yield("tree 4", 10.0, 3.0)  # a few explored rounds that happened to keep little
    pooled = acceptance.pooled_yield()
    assert pooled == pytest.approx((180.0 + 3.0 + 4.0) / (210.0 + 4.0))
    assert 0.8 < acceptance.yield_of("tree 4") < pooled < acceptance.yield_of("chain") < 0.9
    for _ in range(49):  # many more rounds at 0.3: the family's own share wins
        acceptance.observe_yield("tree 4", 10.0, 3.0)
    assert acceptance.yield_of("tree 4") < 0.4


class Tables:
    """``Auto``'s table look-up by live rows, on a dict, counting look-ups."""

    def __init__(self) -> None:
        self.tables: dict[str, CostTable] = {}

    def __call__(self, rows: int) -> tuple[str, CostTable]:
        key = f"batch<={batch_bucket(rows)}"
        return key, self.tables.setdefault(key, CostTable())


def calibrate(policy: CostAwarePolicy, table: CostTable, draft_step: float = 0.01) -> None:
    """Every calibration shape timed 3 times: verification 0.1 s + 1 ms per block token, ``draft_step`` per draft."""
    for shape in policy.calibration:
        for _ in range(3):
            table.add(shape.kind, shape.width, shape.draft_label, draft_step * shape.gamma, 0.1 + 0.001 * shape.width)


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
    # bucket 1 is not calibrated: the call's calibrated bucket-4 table chooses (no calibration shapes in a batch
    # call's last rounds), and the rounds are timed into bucket 1's table
    assert budget.calibration_rounds == 0 and budget.ranked_by is four
    # the bucket-4 round is timed into bucket 4's table, unless it was its shape's first there at a width never timed
    # (one-time costs: CostTable.first_round)
    taken = next(s for s in policy.shapes if s.label == budget.log[0]["shape"])
    fresh = four.samples(taken.kind, taken.width, taken.draft_label) == 0
    assert sum(len(v) for widths in four.verify.values() for v in widths.values()) == samples + (0 if fresh else 1)
    # bucket 1's first calibration round (its shape's first there) is not recorded: one-time costs
    assert sum(len(v) for widths in one.verify.values() for v in widths.values()) == 0 and len(one.seen) == 1
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


#: the batch-1 table's ranking at a batch-8 call's end (its own table ranks chain 2 best at 100): tokens per second
TAILS = {"tree by 3 %": ([("tree", 100.0), (3, 99.0), (2, 97.0)], "chain 2"),
         "tree by 13 %": ([("tree", 110.0), (3, 100.0), (2, 97.0)], "tree 4,3,16"),
         "chain 3 by 3 %": ([(3, 103.0), (2, 100.0), ("tree", 90.0)], "chain 2"),
         "chain 3 by 10 %": ([(3, 110.0), (2, 100.0), ("tree", 90.0)], "chain 3")}


@pytest.mark.parametrize("case", TAILS)
def test_a_batch_calls_last_rounds_keep_its_shape_unless_the_narrower_table_predicts_a_clear_gain(
        monkeypatch, case):
    """The call's own table ranks chain 2 best; the batch-1 table, which chooses the 1-row rounds at its end, ranks
    another shape best: within SWITCH_MARGIN of chain 2 (a tree, or a chain of the same family) the call keeps chain
    2 there; predicted clearly faster, that shape."""
    from hf_specmm.trees import TreeShape

    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    eight, one = tables(8)[1], tables(1)[1]
    calibrate(policy, eight)
    calibrate(policy, one)
    tree = Shape(3, TreeShape(4, 3, 16))
    narrow, tail = TAILS[case]
    ranked = {eight: [Choice(Shape(2), 100.0, 2.3), Choice(Shape(3), 98.0, 2.6), Choice(tree, 90.0, 3.4)],
              one: [Choice(tree if s == "tree" else Shape(s), tps, 3.0) for s, tps in narrow]}
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 8, ())
    monkeypatch.setattr(budget, "ranking", lambda costs: ranked[costs])
    assert budget.for_round([20] * 8, [True] * 8).gamma == 2  # chain 2, the call's own table's best
    live = [True] + [False] * 7
    budget.for_round([20] * 8, live)  # 1 live row: the batch-1 table chooses
    budget.for_round([20] * 8, live)
    assert [e["shape"] for e in budget.log] == ["chain 2", tail]
    first = ranked[one][0].shape
    assert first.label == case.split(" by")[0].replace("tree", "tree 4,3,16")  # the shared ranking as it was
    # a call at batch 1 takes the batch-1 table's best as it is
    alone = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
    monkeypatch.setattr(alone, "ranking", lambda costs: ranked[costs])
    alone.for_round([20], [True])
    alone.for_round([20], [True])
    assert alone.log[0]["shape"] == first.label


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
    # batch calls whose rows finish move through the buckets (2 live rows, then 1): each bucket keeps its ranking
    calibrate(policy, tables(2)[1])
    ranks.clear()
    for call in range(3):
        budget = AutoBudget(policy, acceptance, tables, 2, ())
        budget.for_round([20, 20], [True, True])
        budget.for_round([20, 20], [True, False])
    assert len(ranks) <= 2  # bucket 2's first ranking, and bucket 1's if its refresh fell due


def test_a_kinds_realised_time_scales_its_shapes_predictions():
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    table = CostTable()
    calibrate(policy, table)
    acceptance = AcceptanceTable(depth=4)
    before = {c.shape.label: c for c in policy.rank(acceptance, table, 1)}
    f = table.time_factor
    assert f("chain") == 1.0  # nothing realised yet: the curves as they are
    for _ in range(100):  # taken in turn: chain rounds take twice what the curves predict, tree rounds as predicted
        table.observe_ratio("chain", 1.0, 2.0)
        table.observe_ratio("tree", 1.0, 1.0)
    after = {c.shape.label: c for c in policy.rank(acceptance, table, 1)}

    def chain_over_tree(ranked: dict, chain: str, tree: str) -> float:
        return ranked[chain].predicted_tokens_per_s / ranked[tree].predicted_tokens_per_s

    assert f("chain") / f("tree") == pytest.approx(2.0, rel=0.05)
    for chain, tree in (("chain 3", "tree 2,3,8"), ("chain 2", "tree 2,4,8")):  # every shape of the kind alike
        assert chain_over_tree(after, chain, tree) == pytest.approx(chain_over_tree(before, chain, tree) / 2, rel=0.05)
    assert after["chain 3"].curve_seconds == pytest.approx(before["chain 3"].curve_seconds)
    factor = f("chain")
    table.observe_ratio("chain", 1.0, 100.0)  # a stalled round is clipped at 4x: it moves the prediction, never owns it
    assert factor < f("chain") < 1.5 * factor
    assert CostTable(table.to_json()).time_factor("chain") == pytest.approx(table.time_factor("chain"))  # kept in a file


def test_time_factors_compare_kinds_not_the_moments_they_were_timed_at():
    """The machine slows down 2x while the taken kind changes: two kinds with the same true cost keep the same
    factor (raw recent ratios would make the one timed earlier look 1.5x faster)."""
    table = CostTable()
    for t in range(400):
        speed = 1.0 + min(t, 300) / 300  # a drift over hundreds of rounds, as on shared cores
        table.observe_ratio("chain" if t < 200 else "tree", 1.0, speed)
    a, b = table.time_factor("chain"), table.time_factor("tree")
    assert a == pytest.approx(b, rel=0.1)
    assert b == pytest.approx(2.0, rel=0.1)  # the kind taken now: its realised time at today's speed

def test_a_shapes_first_round_at_a_width_never_timed_is_not_recorded():
    """One-time costs of a new block width (kernels' primitives, first allocations) stay out of the medians the
    curves are read from; a shape whose width and drafting were already timed counts from its first round."""
    table = CostTable()
    assert table.first_round("chain 2", "chain", 3, "chain:2") is True  # cold: skipped
    assert table.first_round("chain 2", "chain", 3, "chain:2") is False
    table.add("chain", 3, "chain:2", 0.01, 0.02)
    table.add("chain", 5, "chain:4", 0.01, 0.02)
    assert table.first_round("chain 4", "chain", 5, "chain:4") is False  # its width and drafting already timed
    assert table.first_round("tree 2,3,8", "tree", 9, "tree:2,3") is True


def test_the_best_shape_of_the_other_kind_is_re_timed_while_within_its_band():
    """Once per exploration gap a drafted round takes, in turn, a contender: the near-ties and the best shape of
    the other kind (a chain where a tree is best) while predicted within OTHER_KIND_BAND, so a kind whose
    predictions went stale is timed again; the other kind's alone while its factor rests on few contrasts (only its
    rounds are contrasts), every EXPLORE_GAP-th round. One predicted far behind is not, once its kind's factor has
    its contrasts: each of its explored rounds would cost that much; until then it is one of the contenders, at the
    refresh's pace (a curve point timed in a slow spell would otherwise never be timed again)."""
    from hf_specmm.auto.budget import EXPLORE_GAP, OTHER_KIND_BAND, SURE_CONTRASTS
    from hf_specmm.trees import TreeShape

    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    _, table = tables(1)
    calibrate(policy, table)
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
    tree, chain, far_tree = Shape(3, TreeShape(2, 3, 8)), Shape(4), Shape(4, TreeShape(4, 4, 16))
    table.seen.update(s.label for s in (tree, chain, far_tree))  # each had a round recorded (see the next test)
    behind = 100.0 * (1.0 - OTHER_KIND_BAND) + 1.0
    budget.ranked, budget.ranked_by = [Choice(tree, 100.0, 3.0), Choice(far_tree, 95.0, 3.0),
                                       Choice(chain, behind, 3.0), Choice(Shape(0), 50.0, 1.0)], table
    taken = [budget._contender(budget.ranked[0]).shape for _ in range(4 * EXPLORE_GAP)]
    assert taken.count(tree) == 4 * EXPLORE_GAP - 4
    assert taken.count(chain) == 4 and far_tree not in taken  # outside the near band, re-timed all the same
    assert Shape(0) not in taken  # plain steps are the probes' business, not exploration's
    table.kind_ratios["chain"] = [1.0] * SURE_CONTRASTS  # the chains are sure now: the contenders take turns
    taken = [budget._contender(budget.ranked[0]).shape for _ in range(4 * EXPLORE_GAP)]
    assert taken.count(far_tree) == 2 and taken.count(chain) == 2
    budget.ranked[2] = Choice(chain, behind - 2.0, 3.0)  # just outside the band, its kind sure: not explored
    taken = [budget._contender(budget.ranked[0]).shape for _ in range(4 * EXPLORE_GAP)]
    assert chain not in taken and taken.count(far_tree) == 4
    del table.kind_ratios["chain"]  # outside the band, its kind's factor unknown: one of the contenders, not first
    taken = [budget._contender(budget.ranked[0]).shape for _ in range(4 * EXPLORE_GAP)]
    assert taken.count(far_tree) == 2 and taken.count(chain) == 2


def test_a_contender_whose_first_round_is_not_recorded_keeps_its_turn():
    """A shape's first round in a table, at a width or drafting never timed there, is not recorded (one-time costs,
    ``CostTable.first_round``), so it is no contrast either: the contender keeps its turn for the next exploration,
    whose round is. Passing the turn on, explorations that rotate among many trees never timed (the other kind's
    near-ties at batch 1) taught the trees' factor nothing."""
    from hf_specmm.auto.budget import EXPLORE_GAP
    from hf_specmm.trees import TreeShape

    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    _, table = tables(1)
    calibrate(policy, table)
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
    best, new, known = Shape(3), Shape(4, TreeShape(4, 4, 16)), Shape(3, TreeShape(2, 3, 8))
    table.seen.update((best.label, known.label))
    budget.ranked, budget.ranked_by = [Choice(best, 100.0, 3.0), Choice(new, 99.0, 3.0), Choice(known, 98.0, 3.0)], \
        table

    def explorations(n: int) -> list[Shape]:
        taken = [budget._contender(budget.ranked[0]) for _ in range(n * EXPLORE_GAP)]
        return [c.shape for c in taken if c.explored]

    assert table.recorded(known.label, known.kind, known.width, known.draft_label)
    assert not table.recorded(new.label, new.kind, new.width, new.draft_label)
    assert explorations(2) == [new, new]  # its round is never recorded here (no round is closed): it keeps the turn
    assert table.first_round(new.label, new.kind, new.width, new.draft_label)  # now its first round has passed
    assert explorations(4) == [new, known, new, known]


def test_a_shallower_chain_whose_costs_are_fixed_is_not_explored():
    """Exploring a chain no deeper than the best chain, its width and drafting timed SAMPLES times, could change
    nothing in its prediction (the best chain's rounds observe every depth it drafts; its curve points are fixed): it
    is left out. A deeper chain (depths the best does not reach) and one whose points are still filling are not."""
    from hf_specmm.auto.budget import EXPLORE_GAP, covered
    from hf_specmm.auto.costs import SAMPLES

    policy = CostAwarePolicy(max_tokens=16, max_depth=8)
    tables = Tables()
    _, table = tables(1)
    calibrate(policy, table)
    for _ in range(SAMPLES):
        table.add("chain", 5, "chain:4", 0.01, 0.02)
    table.kind_ratios["chain"] = [1.0] * 8  # the chains' factor is sure: every near-tie in turn
    budget = AutoBudget(policy, AcceptanceTable(depth=8), tables, 1, ())
    best, shallow, deep, filling = Shape(5), Shape(4), Shape(6), Shape(3)
    table.seen.update(s.label for s in (best, shallow, deep, filling))  # each had a round recorded
    assert covered(shallow, best, table) and not covered(deep, best, table) and not covered(filling, best, table)
    budget.ranked, budget.ranked_by = [Choice(best, 100.0, 4.0), Choice(shallow, 99.0, 3.5), Choice(deep, 98.0, 4.3),
                                       Choice(filling, 97.0, 3.0)], table
    taken = [budget._contender(budget.ranked[0]).shape for _ in range(6 * EXPLORE_GAP)]
    assert shallow not in taken and taken.count(deep) == taken.count(filling) >= 2


def test_a_slow_spell_timed_on_one_shape_slows_every_shapes_prediction_alike():
    """The machine slows down 2x while only chain 3 is taken: its curve must not take the slow spell in alone (the
    untaken tree would then look 2x cheaper next to it, and stay so: nothing re-times an untaken shape's curve
    but rare explored rounds). Timings are kept at the machine's usual speed and the speed index carries the
    spell to every prediction alike."""
    from hf_specmm.auto.costs import SAMPLES
    from hf_specmm.auto.policy import round_time
    from hf_specmm.trees import TreeShape

    chain, tree = Shape(3), Shape(4, TreeShape(2, 4, 8))
    table = CostTable()
    for shape, seconds in ((chain, (0.010, 0.020)), (tree, (0.015, 0.030))):
        for _ in range(SAMPLES):
            table.add(shape.kind, shape.width, shape.draft_label, *seconds)

    def predicted(shape: Shape) -> float:
        return round_time(table, shape) * table.time_factor(shape.kind)

    usual = {chain: 0.030, tree: 0.045}
    for shape in (chain, tree, chain, tree, chain, chain):  # in turn at the usual speed, then chain 3 is taken
        table.observe_ratio(shape.kind, round_time(table, shape), usual[shape])
    before = predicted(tree) / predicted(chain)
    for _ in range(200):  # chain 3's rounds take twice their usual time
        curve = round_time(table, chain)
        table.observe_ratio(chain.kind, curve, 2 * 0.030)
        table.add(chain.kind, chain.width, chain.draft_label, 2 * 0.010, 2 * 0.020)
    assert predicted(chain) == pytest.approx(0.060, rel=0.05)  # the taken shape: as timed now
    assert predicted(tree) / predicted(chain) == pytest.approx(before, rel=0.15)  # raw curves: half of it
    assert table.speed == pytest.approx(2.0, rel=0.15)


def test_calls_run_as_plain_generate_by_whole_calls_measured_not_by_predictions():
    """A prediction must neither hold a draft in plain generate nor keep it out: plain generate is measured once
    calibrated (one call), and calls run so where the recent calls' lengths would take STOCK_MARGIN less time
    that way: each way its overhead plus the tokens at its rate (the speculative rounds' realised rate)."""
    from hf_specmm.auto.calls import MIN_PAIRS, STOCK_MARGIN

    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    calibrate(policy, tables(1)[1])
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
    best = budget.ranking(budget.costs)[0]
    assert best.shape.gamma  # a drafted shape is predicted best
    assert budget.runs_plain()  # never measured: one call as plain generate measures it
    assert budget.whole_call == {"plain_generate": True, "by": "plain generate unmeasured", "share": None,
                                 "check": False}  # (last_stats(model).auto["whole_call"])
    costs = budget.costs
    costs.add_stock_step(2.0 / best.predicted_tokens_per_s)
    assert not budget.runs_plain()  # no speculative call timed beside it yet: one is, whatever the prediction
    step = costs.stock_step_time()
    costs.add_stock_call(1.0, step, 20)  # plain generate: 1 s outside its 20 steps
    for _ in range(3):  # speculative calls: twice plain generate's rate in their rounds, the same overhead
        costs.add_call(2.0 / step, step, 1.0, 20)
    assert costs.stock_share() == pytest.approx((1.0 + 20 * step) / (1.0 + 10 * step))
    assert budget.runs_plain()  # one pair is too few to choose by (MIN_PAIRS): the calls alternate, each making one
    assert budget.whole_call["by"] == "too few pairs"
    costs.add_stock_call(1.0, step, 20)
    assert not budget.runs_plain()
    costs.add_call(2.0 / step, step, 1.0, 20)
    assert len(costs.pairs) == MIN_PAIRS and not budget.runs_plain()  # chosen by the pairs: speculative
    costs.add_call(None, None, 1.0, 1)  # a one-token answer: one round, as long as plain generate's step
    assert not budget.runs_plain()
    for _ in range(5):  # their draft's prefill and set-up grew to 20 plain steps, plain generate timed beside them
        for _ in range(3):
            costs.add_call(2.0 / step, step, 1.0 + 20 * step, 20)
        costs.add_stock_call(1.0, step, 20)
    assert costs.stock_share() * STOCK_MARGIN < 1.0 and budget.runs_plain()
    assert budget.whole_call["by"] == "share" and budget.whole_call["share"] == pytest.approx(costs.stock_share())


def test_the_whole_calls_choice_weighs_the_workloads_mix_of_lengths_not_its_last_block():
    """A call's length is unknown when it starts: the whole calls' choice weighs the lengths of the last
    LENGTH_CALLS calls, so a block of short answers in a workload of long ones leaves its calls speculative, and a
    workload of short answers runs as plain generate. Weighing the last 9 calls, on the shipped world at batch 1
    (prompts in task blocks) calls ran as plain generate after a block of 1-token answers, into the long answers
    after it (1.2-1.45x their chain's time), and the image adapter's Auto came to 1.05x its best chain."""
    from hf_specmm.auto.calls import plain_wins
    from hf_specmm.auto.costs import LENGTH_CALLS

    table = CostTable()
    for _ in range(3):  # pairs: plain generate 1 s outside its steps of 1 s; the speculative loop 2 s and 2 tokens/s
        table.add_stock_call(1.0, 1.0, 20)
        table.add_call(2.0, 2.0, 2.0, 20)
    for _ in range(24):  # a workload of 20-token answers: speculative (2 + 10 s against 21 s)
        table.add_call(2.0, 2.0, 2.0, 20)
    for _ in range(11):  # then a block of 2-token answers (one round, 4 s against 3 s: plain generate's own)
        table.add_call(None, None, 2.0, 2)
    long = 30  # the pairs' calls too
    assert table.pair_share(table.pairs[-1]) == pytest.approx((long * 21 + 11 * 3) / (long * 12 + 11 * 4))
    assert not plain_wins(table.stock_share())
    for _ in range(LENGTH_CALLS):  # a workload of short answers
        table.add_call(None, None, 2.0, 2)
    assert table.stock_share() == pytest.approx(3 / 4) and plain_wins(table.stock_share())


def test_a_choice_of_plain_generate_made_in_a_slow_spell_is_undone_by_the_checks():
    """Plain generate chosen from pairs whose speculative calls ran in a slow spell (rounds 4x their usual time):
    the speculative calls at the gap, timed at the machine's usual speed beside plain generate, take the choice
    back once their pairs outnumber the spell's (the gap used to double as the call was made, and a pair's
    speculative side was the median of the last 3 speculative calls, two of them from the spell: speculative again
    from the 58th call); a check that agrees doubles the gap."""
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    calibrate(policy, tables(1)[1])
    acceptance = AcceptanceTable(depth=4)
    costs = tables(1)[1]
    step = 0.01  # plain generate: 0.1 s outside 20 steps of 10 ms; speculative: 2 tokens a round of 10 ms (40 in it)
    costs.add_stock_step(step)
    for _ in range(2):  # plain generate beside speculative calls in the spell: 3 pairs, plain generate wins
        costs.add_stock_call(0.1, step, 20)
        costs.add_call(50.0, 4 * step, 0.1, 20)
    assert len(costs.pairs) == 3 and costs.stock_share() == pytest.approx(0.6)
    chosen = []
    for _ in range(40):
        runs_plain = AutoBudget(policy, acceptance, tables, 1, ()).runs_plain()
        chosen.append("P" if runs_plain else "s")
        if runs_plain:
            costs.add_stock_call(0.1, step, 20)
        else:
            costs.add_call(200.0, step, 0.1, 20)
    # checked at the 8th and 17th calls (the second check one call past its gap: check_offset(1, 8) == 1): each
    # makes two pairs (with the call before it and the one after), which outnumber the spell's three after the
    # second; plain generate is checked 8 calls after the switch (check_offset(2, 8) == 0), agrees, and the gap
    # doubles
    assert "".join(chosen) == "PPPPPPPs" + "PPPPPPPPs" + "P" + "s" * 7 + "P" + "s" * 14
    assert acceptance.regimes[costs].gap == 16



def test_each_batch_bucket_checks_the_kind_it_did_not_choose_on_its_own_schedule():
    """Calls alternating between batch 1 (plain generate measured faster) and batch 8 (the speculative loop
    faster): each table's choice holds and its other kind is still checked at its 8th call, then at the doubled
    gap (one schedule for the pair started over at every switch of table, and never checked either)."""
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables, acceptance, step = Tables(), AcceptanceTable(depth=4), 0.01
    rates = {1: 50.0, 8: 400.0}  # speculative tokens/s: 0.5 s against plain generate's 0.3 s at 1, 0.15 s at 8
    for batch, rate in rates.items():
        costs = tables(batch)[1]
        calibrate(policy, costs)
        costs.add_stock_step(step)
        for _ in range(2):  # 3 pairs each
            costs.add_stock_call(0.1, step, 20)
            costs.add_call(rate, step, 0.1, 20)
    chosen: dict[int, str] = {1: "", 8: ""}
    for _ in range(30):
        for batch in (1, 8):
            costs = tables(batch)[1]
            runs_plain = AutoBudget(policy, acceptance, tables, batch, ()).runs_plain()
            chosen[batch] += "P" if runs_plain else "s"
            if runs_plain:
                costs.add_stock_call(0.1, step, 20)
            else:
                costs.add_call(rates[batch], step, 0.1, 20)
    # checks at its 8th and 27th calls (the second 16 + check_offset(1, 16) == 19 calls after the first)
    assert chosen[1] == "PPPPPPPs" + "P" * 18 + "s" + "PPP", chosen
    assert chosen[8] == "sssssssP" + "s" * 18 + "P" + "sss", chosen
    assert acceptance.regimes[tables(1)[1]].gap == acceptance.regimes[tables(8)[1]].gap == 32  # two checks agreed
def test_a_pairs_speculative_rate_is_its_calls_tokens_over_their_seconds():
    """A pair's speculative side prices tokens at its calls' pooled rate (their tokens over their seconds), not at
    their median rate: three calls of 10, 40 and 10 tokens at 100, 400 and 1000 tokens/s took 0.21 s for 60 tokens
    (286 tokens/s; the median, 400, priced them 29 % fast)."""
    table = CostTable()
    for rate, tokens in ((100.0, 10), (400.0, 40), (1000.0, 10)):
        table.add_call(rate, 0.01, 0.002, tokens)
    table.add_stock_call(0.001, 0.004, 20)
    (pair,) = table.pairs
    assert pair == [0.001, 0.004, 0.002, pytest.approx(60 / 0.21), 0.01]
    lengths = [10.0, 40.0, 10.0, 20.0]  # the recent calls' lengths, this one's too
    plain = sum(0.001 + 0.004 * n for n in lengths)
    assert table.stock_share() == pytest.approx(plain / sum(0.002 + n * 0.21 / 60 for n in lengths))
    restored = CostTable(table.to_json())
    assert restored.rate_tokens == [10.0, 40.0, 10.0] and restored.stock_share() == pytest.approx(table.stock_share())


def test_plain_generate_is_compared_with_the_speculative_calls_next_to_it_in_time():
    """A slow spell of the speculative calls alone does not make plain generate (timed before it) win: each
    side is read beside the other's calls of the same moment; the calls not chosen run now and then."""
    table, step = CostTable(), 0.01
    table.add_stock_call(1.0, step, 20)
    for _ in range(3):
        table.add_call(2.0 / step, step, 1.0, 20)
    before = table.stock_share()
    assert before == pytest.approx((1.0 + 20 * step) / (1.0 + 10 * step))
    for _ in range(6):  # the machine at half speed: the speculative calls take twice as long
        table.add_call(1.0 / step, 2 * step, 2.0, 20)
    assert table.stock_share() == pytest.approx(before)  # (their own medians over plain generate's old step: 0.55)
    table.add_stock_call(2.0, 2 * step, 20)  # plain generate in the slow spell too
    assert table.stock_share() == pytest.approx(before)
    short = CostTable()  # one-token answers take a whole round of the speculative loop
    short.add_stock_call(0.0, step, 1)
    short.add_call(10.0 / step, 5 * step, 0.0, 1)
    assert short.stock_share() == pytest.approx(0.2)

    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    calibrate(policy, tables(1)[1])
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
    costs = budget.costs
    costs.add_stock_step(step)
    costs.add_stock_call(1.0, step, 20)
    costs.add_call(2.0 / step, step, 1.0, 20)
    runs = []
    for _ in range(40):  # speculative calls win: plain generate at the 8th call, then 16, 32, ... calls apart (and
        # check_offset's few more: 0, 3, 2, 7 at gaps 8, 16, 32, 32)
        runs.append(budget.runs_plain())
        if runs[-1]:
            costs.add_stock_call(1.0, step, 20)
        else:
            costs.add_call(2.0 / step, step, 1.0, 20)
    # one pair before: a plain generate call and a speculative one make MIN_PAIRS, then the choice
    assert [i for i, plain in enumerate(runs) if plain] == [0, 9, 28]
    for _ in range(80):  # calls that leave no pair (no rate: too few rounds) are no evidence: the check is made again on
        runs.append(budget.runs_plain())  # the next call, CHECK_TRIES calls in a row at most, and the gap holds
    assert [i for i, plain in enumerate(runs) if plain] == [0, 9, 28, 62, 63, 64, 65, 104, 105, 106, 107]  # not 62 + 64


def test_checks_do_not_fall_on_the_same_prompts_of_a_workload_that_cycles(monkeypatch):
    """32 prompts in a loop; speculative calls win on 8 of them and lose on the rest (plain generate wins the mix:
    0.41 s a call against 0.3 s). At checks every 8, 16, 32, 64 calls each check fell on the same prompt from the
    second on, its pairs beside the same four: where those were fast, the choice held the speculative loop for good.
    check_offset moves the checks over the cycle, the pairs see the mix, and the calls run as plain generate."""
    from hf_specmm.auto import calls

    step, prompts = 0.01, 32

    def run(fast: set[int]) -> str:
        policy, tables = CostAwarePolicy(max_tokens=16, max_depth=4), Tables()
        calibrate(policy, tables(1)[1])
        budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
        costs = budget.costs
        costs.add_stock_step(step)
        for _ in range(9):  # the first pairs beside prompts the speculative loop wins on
            costs.add_stock_call(0.1, step, 20)
            costs.add_call(400.0, step, 0.1, 20)  # 0.15 s against plain generate's 0.3 s
        chosen = ""
        for call in range(640):
            plain = budget.runs_plain()
            chosen += "P" if plain else "s"
            if plain:
                costs.add_stock_call(0.1, step, 20)
            else:  # 20 tokens: 0.15 s on the fast prompts, 0.5 s on the others
                costs.add_call(400.0 if call % prompts in fast else 50.0, step, 0.1, 20)
        return chosen

    with monkeypatch.context() as m:
        m.setattr(calls, "check_offset", lambda checks, gap: 0)  # checks exactly at the gaps
        before = run(set(range(prompts)))  # the speculative loop wins every call: where its checks fall
        checks = [i for i, c in enumerate(before) if c == "P"]
        assert len({i % prompts for i in checks[1:]}) == 1  # one prompt, from the second check on
        # the speculative loop wins beside the first two checks' prompts (the three calls before a check and the one
        # after: the speculative sides of the two pairs it makes), so that they agree with the choice: 8 of 32
        fast = {(check + k) % prompts for check in checks[:2] for k in (-3, -2, -1, 1)}
        aliased = run(fast)
    assert aliased[-320:].count("s") >= 310  # held speculative, on four prompts' evidence
    walked = run(fast)
    assert walked[-320:].count("P") >= 300, walked  # plain generate, checked now and then


def test_plain_steps_ranked_best_by_the_prior_alone_leave_calls_speculative():
    """A new pair on calibrated costs whose prior ranks plain steps best (a draft step twice a verification): its
    calls stay speculative, whose probes observe the acceptance that plain generate never sees, until the pair has
    seen EVIDENCE_ROUNDS drafted rounds and PROBES_LOST probes in a row lost to plain steps; then they run as plain
    generate."""
    from hf_specmm.auto.calls import EVIDENCE_ROUNDS, PROBES_LOST
    from hf_specmm.auto.policy import PLAIN

    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    _, table = tables(1)
    calibrate(policy, table, draft_step=0.2)
    table.add_stock_step(0.1)  # plain generate measured
    acceptance = AcceptanceTable(depth=4)
    budget = AutoBudget(policy, acceptance, tables, 1, ())
    assert budget.ranking(table)[0].shape == PLAIN
    runs = []
    for _ in range(EVIDENCE_ROUNDS):
        runs.append(budget.runs_plain())
        acceptance.observe_chain([0], [1])  # the call's probe: a chain of 1, rejected
    assert runs == [False] * EVIDENCE_ROUNDS and not budget.runs_plain()  # no probe has lost to plain steps yet
    acceptance.probes_lost = PROBES_LOST - 1
    assert not budget.runs_plain()
    acceptance.probes_lost = PROBES_LOST  # the best drafted shape's and the other kind's probes lost
    assert budget.runs_plain()


def _simulate(monkeypatch, budget: AutoBudget, rounds: int, draft_step: float, accepts: bool) -> list[str]:
    """``rounds`` rounds of one live row on a fake clock: a verification takes 0.1 s + 1 ms per block token, a draft
    ``draft_step`` per token; the target takes every draft (``accepts``) or none. Returns the shapes taken."""
    from types import SimpleNamespace

    import torch

    import hf_specmm.auto.budget as budget_module

    clock = [0.0]
    monkeypatch.setattr(budget_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    for _ in range(rounds):
        gamma = budget.for_round([1000], [True]).gamma
        clock[0] += draft_step * gamma
        budget.drafted()
        clock[0] += 0.1 + 0.001 * (gamma + 1)
        n = gamma if accepts else 0
        budget.observe(SimpleNamespace(gamma=gamma, tree=None), SimpleNamespace(n=torch.tensor([n])), [True],
                       [n + 1], [False])
        budget.update([n + 1], gamma)
    budget.for_round([1000], [True])  # closes the last round
    return [entry["shape"] for entry in budget.log]


def test_a_probe_that_beats_plain_steps_is_taken_again_until_the_curves_agree(monkeypatch):
    """Calibration timed every drafted round 0.2 s too slow in each phase (on an H200 they took 3-7x the same
    shapes' fixed rounds): plain steps rank first although the draft is always right. A probe that realises more
    tokens per second than the plain steps before it is taken again at once, its timings reach the curves'
    medians, and the chain of 4 ranks best. A probe that loses is not repeated: the gap doubles (a useless draft
    costs ever fewer probes)."""
    from hf_specmm.auto.budget import MIN_PROBE_GAP
    from hf_specmm.auto.policy import PLAIN

    policy = CostAwarePolicy(max_tokens=16, max_depth=4, trees=False)

    def budget(accepts: bool) -> AutoBudget:
        tables = Tables()
        for shape in policy.calibration:
            slow = 0.2 if shape.gamma else 0.0
            for _ in range(3):
                tables(1)[1].add(shape.kind, shape.width, shape.draft_label, 0.01 * shape.gamma + slow,
                                 0.1 + 0.001 * shape.width + slow)
        acceptance = AcceptanceTable(depth=4)
        for _ in range(30):  # the pair's acceptance is known: every draft right, or none
            acceptance.observe_chain([4 if accepts else 0], [4 if accepts else 1])
        made = AutoBudget(policy, acceptance, tables, 1, ())
        assert made.ranking(made.costs)[0].shape == PLAIN
        return made

    good = budget(accepts=True)
    shapes = _simulate(monkeypatch, good, 60, draft_step=0.01, accepts=True)
    assert shapes.index("chain 4") == MIN_PROBE_GAP  # plain steps until the first probe: the best drafted shape
    assert shapes[MIN_PROBE_GAP:] == ["chain 4"] * (60 - MIN_PROBE_GAP)  # 5 tokens in 0.15 s, plain 1 in 0.1 s
    assert good.ranked[0].shape == Shape(4)

    useless = budget(accepts=False)
    shapes = _simulate(monkeypatch, useless, 60, draft_step=0.01, accepts=False)
    probes = [i for i, s in enumerate(shapes) if s != "plain"]
    assert probes == [8, 8 + 17, 8 + 17 + 33] and useless.acceptance.probe_won is None


def test_probes_take_the_best_drafted_shape_and_the_other_kinds_best_in_turn(monkeypatch):
    """A probe corrects its own kind's curves only: probes alternate the best drafted shape and the best of the
    other kind (chains, trees), and the gap doubles once both lost (a useless draft: 8, 8, 16, 16, 32, ...)."""
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    calibrate(policy, tables(1)[1], draft_step=0.2)
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
    shapes = _simulate(monkeypatch, budget, 80, draft_step=0.01, accepts=False)
    probes = [i for i, s in enumerate(shapes) if s != "plain"]
    assert probes == [8, 17, 34, 51]
    kinds = ["tree" if shapes[i].startswith("tree") else "chain" for i in probes]
    assert kinds[0] != kinds[1] and kinds[:2] == kinds[2:]


def test_a_batch_calls_rate_is_its_longest_rows_tokens_per_second(monkeypatch):
    """Plain generate's side of a whole call is its longest row's steps; the speculative side is its longest row's
    tokens at the call's rate, so that rate is the longest row's tokens per second of the call's rounds. Tokens
    per row-second weight each round by its live rows: at batch 8 on the world, 8-29 % slow (the 8-row rounds
    stood for the longest row's time, run mostly in 1-3-row rounds)."""
    from types import SimpleNamespace

    import hf_specmm.auto.budget as budget_module

    clock = [0.0]
    monkeypatch.setattr(budget_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    calibrate(policy, tables(2)[1])
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 2, ())
    rounds = (([True, True], [3, 1], 0.2), ([True, False], [3, 0], 0.1), ([True, False], [2, 0], 0.1))
    for live, kept, seconds in rounds:
        budget.for_round([20, 20], live)
        clock[0] += seconds
        budget.update(kept, 0)
    budget.report()
    assert budget.costs.rates == [pytest.approx(8 / 0.4)]  # not 9 tokens / 0.6 row-seconds
    assert budget.costs.lengths == [8.0] and budget.costs.round_seconds == [pytest.approx(0.4 / 3)]


@pytest.mark.parametrize("narrow_calibrated", [False, True])
def test_only_rounds_of_the_calls_own_bucket_are_explored(monkeypatch, narrow_calibrated):
    """A batch call's last rounds, with fewer live rows, are timed into their narrower bucket's table and chosen by
    the call's while that one is still filling in: such a round's time is no contrast for either table's factor
    (``CostTable.observe_ratio``), so exploring there would cost a round for nothing. Chosen by the narrower table
    once it is calibrated, they are what the whole call waits for (its other rows are done): not explored either. A
    batch-1 call's rounds are its own bucket's, and explored as ever."""
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    calibrate(policy, tables(4)[1])
    if narrow_calibrated:
        for rows in (1, 2):
            calibrate(policy, tables(rows)[1])
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 4, ())
    asked = []
    monkeypatch.setattr(budget, "_contender", lambda best: asked.append(best) or best)
    for rows in (4, 4, 1, 1, 3, 2):
        budget.open = None  # no wall-clock timing of these empty rounds
        budget.for_round([20] * 4, [True] * rows + [False] * (4 - rows))
    assert len(asked) == 3  # the rounds of 4, 4 and 3 live rows (the call's bucket); not those of 1 and 2
    if narrow_calibrated:
        single = AutoBudget(policy, budget.acceptance, tables, 1, ())
        monkeypatch.setattr(single, "_contender", lambda best: asked.append(best) or best)
        single.for_round([20], [True])
        assert len(asked) == 4


def test_batch_rounds_are_ranked_for_a_row_whose_answer_does_not_end():
    """A batch call lasts as long as its longest row's rounds, and that row ends once: batch tables rank shapes by
    the tokens per round of a row whose answer does not end in the round, where the answers' pooled end hazard cost
    deep chains their last drafts (on the world at batch 8 the image adapter's best fixed shape was chain 8 in 31 of
    64 runs, and Auto took chains 2-6 in 26 of them). The expectation a round is compared with afterwards (its
    realised share) keeps the end."""
    policy = CostAwarePolicy(max_tokens=16, max_depth=8)
    table = CostTable()
    calibrate(policy, table, draft_step=0.05)
    acceptance = AcceptanceTable(depth=8)
    for _ in range(200):
        acceptance.observe_chain([8], [8])
    acceptance.observe_ends(100.0, 10)  # λ = 10 / (100 + 32): answers of ~13 tokens

    def best_chain(ranked: list) -> Choice:
        return next(c for c in ranked if c.shape.gamma and c.shape.tree is None)

    single, batch = policy.rank(acceptance, table, 1), policy.rank(acceptance, table, 1, batch=True)
    assert best_chain(single).shape.gamma < best_chain(batch).shape.gamma == 8
    by_shape = {c.shape: c for c in single}
    assert all(c.expected_tokens == pytest.approx(by_shape[c.shape].expected_tokens) for c in batch)


def test_calibration_times_each_shape_in_a_run_whose_first_round_is_not_timed():
    """Taken in turn, each calibration round followed a round of another shape, and the shortest shapes were timed
    slow (a plain step 1.13-1.22x its rounds on the world): each shape is taken in a run, its first round untimed
    (after another shape's), its next three timed. A call's last round is never timed (it has the call's end); a
    run the call's end cut short goes on first in the next call, whose first round is timed (no shape before it)."""
    policy = CostAwarePolicy(max_tokens=16, max_depth=4)
    tables = Tables()
    _, table = tables(1)
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
    for _ in range(7):  # the first shape's run and the second's first three rounds
        budget.for_round([40], [True])
    budget.report()  # the call ends inside the second shape's run
    first, second = policy.calibration[:2]
    assert [e["shape"] for e in budget.log] == [first.label] * 4 + [second.label] * 3
    assert table.samples(first.kind, first.width, first.draft_label) == 3
    assert table.samples(second.kind, second.width, second.draft_label) == 1
    budget = AutoBudget(policy, AcceptanceTable(depth=4), tables, 1, ())
    while not policy.calibrated(table):
        budget.for_round([40], [True])
    shapes = [e["shape"] for e in budget.log]  # (the round open now is the first the cost model chose)
    assert not budget.open["choice"].calibrating
    # the second shape's two missing timings at once, then a run of 4 for each other shape
    assert shapes[:2] == [second.label] * 2 and len(shapes) == 2 + 4 * (len(policy.calibration) - 2), shapes
    runs = [shapes[2 + 4 * i: 6 + 4 * i] for i in range(len(policy.calibration) - 2)]
    assert [run[0] for run in runs] == [s.label for s in policy.calibration[2:]], shapes
    assert all(len(set(run)) == 1 for run in runs), shapes
    assert all(table.samples(s.kind, s.width, s.draft_label) == 3 for s in policy.calibration)
