"""``CostAwarePolicy.rank`` made cheaper (it runs on the decoding path) gives exactly what the straightforward
algorithm gives: the same shapes in the same order with the same floats, on seeded tables with observations and
calibrated timings. The reference below is the ranking as it was written before (a plain copy)."""

from __future__ import annotations

import random

import pytest

from hf_specmm.auto import AcceptanceTable, CostAwarePolicy, CostTable
from hf_specmm.auto.acceptance import DEPTH_STRENGTH, PRIOR_STRENGTH, RANK_PRIOR_RATIO, chain_lengths
from hf_specmm.auto.costs import CostModel, interpolate
from hf_specmm.auto.policy import TOP_KS, TREE_NODES, Choice, Shape, calibration_shapes


# ---- the reference: the ranking as first written ------------------------------------------------------------
def _reference_pooled_hazard(table: AcceptanceTable, rank: int, prior: float | None = None) -> float:
    if prior is None:
        prior = table.prior[0] if rank == 0 else RANK_PRIOR_RATIO * _reference_pooled_hazard(table, 0)
    hits = sum(row[rank] for row in table.hits)
    trials = sum(row[rank] for row in table.trials)
    return (hits + PRIOR_STRENGTH * prior) / (trials + PRIOR_STRENGTH)


def _reference_probabilities(table: AcceptanceTable, depth: int, ranks: int) -> list[list[float]]:
    pooled = None
    if table.depth_prior is None:
        pooled = [_reference_pooled_hazard(table, r) for r in range(min(ranks, table.ranks))]
    out = []
    for d in range(1, depth + 1):
        row, left = [], 1.0
        for r in range(ranks):
            di, ri = min(d, table.depth) - 1, min(r, table.ranks - 1)
            prior = pooled[ri] if pooled is not None else _reference_pooled_hazard(table, ri, table.depth_prior[di][ri])
            h = (table.hits[di][ri] + DEPTH_STRENGTH * prior) / (table.trials[di][ri] + DEPTH_STRENGTH)
            row.append(left * h)
            left *= 1.0 - h
        out.append(row)
    return out


def _reference_tree_lengths(p, top_k: int, max_depth: int, nodes) -> dict[tuple[int, int], float]:
    out: dict[tuple[int, int], float] = {}
    values: list[float] = []
    frontier = [1.0]
    most = max(nodes)
    for depth in range(1, max_depth + 1):
        row = p[min(depth - 1, len(p) - 1)]
        level = [v * row[min(r, len(row) - 1)] for v in frontier for r in range(top_k)]
        values.extend(level)
        frontier = sorted(level, reverse=True)[:top_k]
        if depth < 2:
            continue
        prefix = [0.0]
        for v in sorted(values, reverse=True)[:most]:
            prefix.append(prefix[-1] + v)
        for n in nodes:
            if n <= len(values):
                out[(depth, n)] = prefix[min(n, most)]
    return out


def _reference_interpolate(points: dict[int, float], x: float) -> float | None:
    import bisect

    if not points:
        return None
    xs = list(points)
    if any(b < a for a, b in zip(xs, xs[1:])):
        xs.sort()
    if len(xs) == 1:
        return points[xs[0]]
    if x <= xs[0]:
        a, b = xs[0], xs[1]
    elif x >= xs[-1]:
        a, b = xs[-2], xs[-1]
    else:
        i = bisect.bisect_left(xs, x)
        a, b = xs[i - 1], xs[i]
    slope = (points[b] - points[a]) / (b - a)
    y = points[a] + slope * (x - a)
    if x > xs[-1]:
        y = max(y, points[xs[-1]])
    if x < xs[0]:
        y = min(y, points[xs[0]])
    return max(y, 0.0)


def _reference_round_time(model: CostModel, shape: Shape) -> float | None:
    """round_time as first written, read from the model's fitted curves (isotonic, line: unchanged)."""
    verify = _reference_interpolate(model.verify[shape.kind], shape.width)
    base = _reference_interpolate(model.chain, 1)
    if shape.tree is not None:
        if base is None:
            draft = None
        else:
            level = _reference_interpolate(model.level, shape.tree.top_k)
            if level is None:
                two = _reference_interpolate(model.chain, 2)
                level = 0.0 if two is None else max(two - base, 0.0)
            draft = base + (shape.tree.depth - 1) * level
    else:
        draft = _reference_interpolate(model.chain, shape.gamma) if shape.gamma else 0.0
    if verify is None or draft is None:
        return None
    return verify + draft


def _reference_expected(policy: CostAwarePolicy, table: AcceptanceTable, ends: bool) -> dict[Shape, float]:
    p = _reference_probabilities(table, policy.max_depth, max(TOP_KS))
    if ends:
        keep = 1.0 - table.end_hazard()
        p = [[v * (keep if d else 1.0) for v in row] for d, row in enumerate(p)]
    chains = chain_lengths(p, policy.max_depth)
    out: dict[Shape, float] = {}
    by_k: dict[int, dict[tuple[int, int], float]] = {}
    for s in policy.shapes:
        if s.tree is None:
            out[s] = chains[s.gamma - 1] if s.gamma else 0.0
            continue
        k = s.tree.top_k
        if k not in by_k:
            by_k[k] = _reference_tree_lengths(p, k, policy.max_depth, TREE_NODES)
        out[s] = by_k[k][(s.tree.depth, s.tree.nodes)]
    return out


def _reference_rank(policy: CostAwarePolicy, acceptance: AcceptanceTable, costs: CostTable, rows: int,
                    batch: bool = False) -> list[Choice]:
    choices = []
    model = costs.model()
    shares: dict[str, float] = {}
    expected = _reference_expected(policy, acceptance, True)
    critical = _reference_expected(policy, acceptance, False) if batch else expected
    for shape, accepted in expected.items():
        seconds = _reference_round_time(model, shape)
        if seconds is None or seconds <= 0:
            continue
        if shape.gamma and shape.family not in shares:
            shares[shape.family] = acceptance.yield_of(shape.family)
        tokens = 1.0 + accepted * shares[shape.family] if shape.gamma else 1.0
        scored = 1.0 + critical[shape] * shares[shape.family] if shape.gamma else 1.0
        realised = seconds * costs.time_factor(shape.kind)
        choices.append(Choice(shape, rows * scored / realised, tokens, accepted, seconds))
    choices.sort(key=lambda c: -c.predicted_tokens_per_s)
    return choices


# ---- seeded tables ------------------------------------------------------------------------------------------
def seeded_acceptance(seed: int, depth: int = 8, prior: bool = False) -> AcceptanceTable:
    """Chains, trees, answers' ends and realised shares observed at random (seeded), as a call's rounds leave them."""
    rng = random.Random(seed)
    profile = [[0.6 - 0.03 * d, 0.15, 0.05] for d in range(depth)] if prior else None
    table = AcceptanceTable(depth=depth, ranks=8, prior=profile)
    quality = rng.uniform(0.3, 0.9)
    for _ in range(rng.randint(20, 200)):
        gamma = rng.randint(1, depth)
        table.observe_chain([min(sum(rng.random() < quality for _ in range(gamma)), gamma)], [gamma])
    for _ in range(rng.randint(10, 150)):
        k, n = rng.choice((2, 4, 8)), rng.randint(0, depth - 1)
        children = [rng.randint(1, k) for _ in range(n + 1)]
        ranks = [rng.randrange(c) for c in children]
        table.observe_tree([n], [children], [ranks], [rng.random() < 0.1])
    table.observe_ends(rng.uniform(50, 500), rng.randint(0, 20))
    for family in ("chain", "tree 2", "tree 4", "tree 8"):
        for _ in range(rng.randint(0, 20)):
            expected = rng.uniform(0.5, 5.0)
            table.observe_yield(family, expected, expected * rng.uniform(0.5, 1.1))
    return table


def seeded_costs(seed: int, max_tokens: int = 64, max_depth: int = 8) -> CostTable:
    """Every calibration shape timed 3-4 times with noise, a few more widths, and both kinds' realised ratios."""
    rng = random.Random(1000 + seed)
    table = CostTable()
    for shape in calibration_shapes(max_tokens, max_depth):
        for _ in range(rng.randint(3, 4)):
            verify = (0.02 if shape.kind == "chain" else 0.024) + 0.0002 * shape.width * rng.uniform(0.8, 1.2)
            table.add(shape.kind, shape.width, shape.draft_label, 0.004 * shape.gamma * rng.uniform(0.8, 1.3), verify)
    for width in (5, 17, 25):
        kind = rng.choice(("chain", "tree"))
        table.add(kind, width, None, 0.0, 0.021 + 0.0002 * width * rng.uniform(0.7, 1.3))
    table.add("chain", 5, "chain:4", 0.016 * rng.uniform(0.9, 1.1), 0.022)
    for _ in range(6):
        for kind in ("chain", "tree"):
            table.observe_ratio(kind, 0.03, 0.03 * rng.uniform(0.8, 1.3))
    return table


CASES = [(64, 8, True, True), (64, 8, False, True), (64, 8, True, False), (24, 8, True, True), (64, 5, True, True),
         (24, 5, False, False)]


@pytest.mark.parametrize("max_tokens,max_depth,plain,trees", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_rank_equals_the_reference_exactly(max_tokens, max_depth, plain, trees, seed):
    policy = CostAwarePolicy(max_tokens, max_depth, plain, trees)
    costs = seeded_costs(seed, max_tokens, max_depth)
    for prior in (False, True):
        acceptance = seeded_acceptance(seed, max_depth, prior)
        for batch in (False, True):
            for rows in (1, 5):
                want = _reference_rank(policy, acceptance, costs, rows, batch)
                got = policy.rank(acceptance, costs, rows, batch)
                assert got == want  # dataclass equality: every field, floats to the last bit
                assert [c.shape for c in got] == [c.shape for c in want] and len(got) > 1


def test_rank_equals_the_reference_on_fresh_and_deeper_tables():
    """No observation at all (priors only), and an acceptance table deeper than the policy's depth."""
    policy = CostAwarePolicy(64, 8)
    costs = seeded_costs(7)
    for acceptance in (AcceptanceTable(depth=8), seeded_acceptance(5, depth=12), seeded_acceptance(6, 12, True)):
        for batch in (False, True):
            assert policy.rank(acceptance, costs, 1, batch) == _reference_rank(policy, acceptance, costs, 1, batch)


def partial_costs(seed: int, trees: bool) -> CostTable:
    """Calibration cut short: chains only (trees' levels then cost a chain step), or no drafted shape at all."""
    rng = random.Random(2000 + seed)
    table = CostTable()
    for width in (1, 3, 9):
        table.add("chain", width, f"chain:{width - 1}" if width > 1 and trees else None, 0.004 * width,
                  0.02 + 0.0003 * width * rng.uniform(0.8, 1.2))
    table.add("tree", 9, None, 0.0, 0.025)
    return table


@pytest.mark.parametrize("seed", [0, 1])
def test_rank_equals_the_reference_with_costs_part_timed(seed):
    policy = CostAwarePolicy(64, 8)
    acceptance = seeded_acceptance(seed)
    for costs in (partial_costs(seed, True), partial_costs(seed, False), CostTable()):
        for batch in (False, True):
            assert policy.rank(acceptance, costs, 1, batch) == _reference_rank(policy, acceptance, costs, 1, batch)


def test_interpolate_equals_the_reference():
    for seed in range(50):
        rng = random.Random(seed)
        points = {x: rng.uniform(0, 2) for x in rng.sample(range(1, 70), rng.randint(1, 6))}  # keys in any order
        for x in (0, 1, 2, 5, 9, 17, 33, 65, 80, *points):
            assert interpolate(points, x) == _reference_interpolate(points, x)


def test_tree_lengths_equal_the_reference():
    from hf_specmm.auto.acceptance import tree_lengths

    for seed in range(20):
        rng = random.Random(seed)
        depth = rng.randint(2, 10)
        p = [[rng.random() * 0.5 ** r for r in range(rng.randint(1, 8))] for _ in range(rng.randint(1, depth))]
        for k in (1, 2, 3, 4, 8):
            nodes = sorted(rng.sample(range(2, 80), 5))
            assert tree_lengths(p, k, depth, nodes) == _reference_tree_lengths(p, k, depth, nodes)
