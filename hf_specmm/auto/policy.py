"""The shape of a round with the highest expected tokens per second.

For every candidate shape s (a plain target step, a chain of γ, a tree (top_k, depth, N)):

    tokens/s(s) = rows · (1 + y(s) · E[accepted | s]) / (z(s) · (T_verify(kind, width(s)) + T_draft(s)))

with E[accepted] from the learned acceptance (:mod:`hf_specmm.auto.acceptance`; for a draft that reads tokens
only, the recent answers' rounds, :mod:`hf_specmm.auto.runs`), y(s) the share of it that rounds realised so far,
every family's pooled and s's family's own (chains; trees of one top_k) shrunk toward it
(:meth:`~hf_specmm.auto.acceptance.AcceptanceTable.yield_of`), the times from the measured costs' fitted curves
(:mod:`hf_specmm.auto.costs`) and z(s) the realised share of those times for s's kind
(:meth:`~hf_specmm.auto.costs.CostTable.time_factor`). A plain step has E = 0 and no drafting. Until every
calibration shape of the cost key has been timed, rounds take those shapes in turn (real rounds: their tokens
count).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Sequence

from ..trees.expand import TreeShape
from .acceptance import AcceptanceTable, chain_lengths, tree_lengths
from .costs import CALIBRATION_SAMPLES, CostModel, CostTable

TOP_KS = (2, 4, 8)
TREE_NODES = (8, 16, 24, 32, 48, 64)
#: the shape ranked best before keeps its place unless one of its family or one predicted this much faster is best
#: (see :func:`hold`)
SWITCH_MARGIN = 0.04


@dataclass(frozen=True)
class Shape:
    """One round's shape: ``gamma`` 0 is a plain target step; with ``tree`` a draft tree (γ its depth)."""

    gamma: int
    tree: TreeShape | None = None

    @property
    def kind(self) -> str:
        return "tree" if self.tree is not None else "chain"

    @property
    def width(self) -> int:
        """Tokens the target verifies in the round's one forward."""
        return 1 + (self.tree.nodes if self.tree is not None else self.gamma)

    @property
    def draft_label(self) -> str | None:
        """The drafting cost's key (None: nothing drafted)."""
        if self.tree is not None:
            return f"tree:{self.tree.top_k},{self.tree.depth}"
        return f"chain:{self.gamma}" if self.gamma else None

    @property
    def family(self) -> str:
        """Shapes whose realised acceptance is pooled: chains; trees of one top_k."""
        return f"tree {self.tree.top_k}" if self.tree is not None else "chain"

    @property
    def label(self) -> str:
        if self.tree is not None:
            return f"tree {self.tree.top_k},{self.tree.depth},{self.tree.nodes}"
        return f"chain {self.gamma}" if self.gamma else "plain"


PLAIN = Shape(0)


def candidate_shapes(max_tokens: int, max_depth: int, plain: bool = True, trees: bool = True) -> list[Shape]:
    """Plain, chains of γ 1..``max_depth`` (≤ ``max_tokens``), trees of top_k in :data:`TOP_KS`, depth
    2..``max_depth`` and N in :data:`TREE_NODES` (≤ ``max_tokens``, ≤ the expansion's candidates, > top_k)."""
    shapes = [PLAIN] if plain else []
    shapes += [Shape(g) for g in range(1, min(max_depth, max_tokens) + 1)]
    if trees:
        for k in TOP_KS:
            for depth in range(2, max_depth + 1):
                for n in TREE_NODES:
                    if k < n <= min(max_tokens, k + (depth - 1) * k * k):
                        shapes.append(Shape(depth, TreeShape(k, depth, n)))
    return shapes


def calibration_shapes(max_tokens: int, max_depth: int, plain: bool = True, trees: bool = True) -> list[Shape]:
    """The shapes timed first for a new cost key: the ends and the middle of the widths (1, 3 and 1 + γ_max
    for chains, 9, 33 and 65 for trees) and tree levels of width 2, 4 and 8, the points the cost model's
    curves run through (every other shape is predicted from them)."""
    shapes = [PLAIN] if plain else []
    shapes += [Shape(g) for g in sorted({min(2, max_depth, max_tokens), min(8, max_depth, max_tokens)})]
    if trees:
        for k, depth, n in ((2, 4, 8), (4, 6, 32), (8, 6, 64)):
            depth = min(depth, max_depth)
            if depth >= 2 and n <= max_tokens and n <= k + (depth - 1) * k * k:
                shapes.append(Shape(depth, TreeShape(k, depth, n)))
    return shapes


@dataclass
class Choice:
    shape: Shape
    predicted_tokens_per_s: float | None  # None: a calibration round
    expected_tokens: float  # per row: 1 + y · E[accepted] (see the module)
    accepted: float = 0.0  # per row: E[accepted] by the acceptance table alone
    curve_seconds: float = 0.0  # the round's time by the fitted cost curves alone (before the realised factor)
    explored: bool = False  # taken to explore it, not as the ranking's best (AutoBudget._contender)
    calibrating: bool = False  # a calibration round (CostAwarePolicy.calibrating)
    #: a probe (AutoBudget._probe): the tokens per second per row of the plain steps before it, which it must beat
    versus: float | None = None


class CostAwarePolicy:
    """Chooses each round's shape from the learned acceptance and the measured costs (see the module)."""

    def __init__(self, max_tokens: int = 64, max_depth: int = 8, plain: bool = True, trees: bool = True):
        self.max_tokens, self.max_depth = max_tokens, max_depth
        #: what a round takes while the cost model cannot choose: a plain step, or a chain of 1 for a drafter
        #: that cannot follow plain steps
        self.fallback = PLAIN if plain else Shape(1)
        self.shapes = candidate_shapes(max_tokens, max_depth, plain, trees)
        self.calibration = calibration_shapes(max_tokens, max_depth, plain, trees)
        #: per candidate, the kind and family a ranking reads (worked out once: a ranking is on the decoding path)
        self._plan = [(s, s.kind, s.family) for s in self.shapes]
        self._top_ks = sorted({s.tree.top_k for s in self.shapes if s.tree is not None})
        #: tables with every calibration timing (a table's samples never shrink: once calibrated, always)
        self._calibrated: weakref.WeakSet[CostTable] = weakref.WeakSet()

    def calibrating(self, costs: CostTable, room: int, previous: str | None = None) -> Shape | None:
        """The next calibration shape that fits in ``room`` drafts (near max_length a cut shape would be timed as
        another), or None once each has enough timings (or none fits): ``previous`` (the label of the call's last
        round's shape) again while it has too few, so each shape is timed in a run of rounds, else one whose run a
        call's end cut short, else the one with the fewest. A round after a round of another shape is not timed
        (:class:`~hf_specmm.auto.budget.AutoBudget`; a call's first is): taken in turn, each round after another
        shape, the calibration timed the shortest shapes slow, and they were not timed again unless taken (on the
        world, medians over 6-8 fresh tables in four processes: a plain step 1.13-1.22x and chain 2's drafting
        1.04-1.17x the same shapes' rounds in calls of one shape; in runs 0.99-1.05x)."""
        if costs in self._calibrated:  # asked every round: a calibrated table stays so (see calibrated)
            return None
        run = next((s for s in self.calibration if s.label == previous), None)
        if run is not None and run.gamma <= room and costs.samples(run.kind, run.width, run.draft_label) < \
                CALIBRATION_SAMPLES:
            return run
        # a run a call's end cut short first (its next round, at the call's start, is timed), then the fewest
        counts = [(not 0 < n < CALIBRATION_SAMPLES, n, i) for i, s in enumerate(self.calibration) if s.gamma <= room
                  for n in (costs.samples(s.kind, s.width, s.draft_label),) if n < CALIBRATION_SAMPLES]
        return self.calibration[min(counts)[2]] if counts else None

    def calibrated(self, costs: CostTable) -> bool:
        if costs in self._calibrated:  # asked several times a round: a table, once calibrated, stays so
            return True
        done = all(costs.samples(s.kind, s.width, s.draft_label) >= CALIBRATION_SAMPLES for s in self.calibration)
        if done:
            self._calibrated.add(costs)
        return done

    def expected_accepted(self, acceptance: AcceptanceTable, ends: bool = True) -> dict[Shape, float]:
        """E[accepted drafts] of every candidate shape (``ends``: with answers' ends, else for a row not ending)."""
        p = acceptance.probabilities(self.max_depth, max(TOP_KS))
        return dict(zip(self.shapes, self._accepted(acceptance.with_ends(p) if ends else p)))

    def _accepted(self, p: list[list[float]]) -> list[float]:
        """E[accepted drafts] of each candidate, in :attr:`shapes`' order, under the probabilities ``p``."""
        chains = chain_lengths(p, self.max_depth)
        trees = {k: tree_lengths(p, k, self.max_depth, TREE_NODES) for k in self._top_ks}
        return [trees[s.tree.top_k][(s.tree.depth, s.tree.nodes)] if s.tree is not None
                else chains[s.gamma - 1] if s.gamma else 0.0 for s in self.shapes]

    def _from_answers(self, accepted: list[float], p: list[list[float]], chains: list[float] | None) -> list[float]:
        """``accepted`` (E[accepted drafts] per candidate by the per-depth table ``p``) with the recent answers'
        rounds where there are enough of them (``chains``: tokens per round of a chain of γ,
        :meth:`~hf_specmm.auto.runs.AnswerBook.chain_tokens`): a chain's from its rounds over the answers, a
        tree's scaled by what they make of the table's chain of its depth. The table sees depths, not where in an
        answer the draft misses: on the shipped world, whose answers run easy between a few hard tokens, it put
        chain 8 11 % above the rounds and chain 4 3 % below (:mod:`hf_specmm.auto.runs`)."""
        if chains is None or len(chains) < self.max_depth:
            return accepted
        table = chain_lengths(p, self.max_depth)
        scale = [(c - 1.0) / t if t > 1e-6 else 1.0 for c, t in zip(chains, table)]
        return [chains[s.gamma - 1] - 1.0 if s.tree is None and s.gamma else
                a * scale[s.gamma - 1] if s.gamma else a for s, a in zip(self.shapes, accepted)]

    def rank(self, acceptance: AcceptanceTable, costs: CostTable, rows: int, batch: bool = False) -> list[Choice]:
        """Every candidate with a predicted cost, best first. ``batch``: rounds of several live rows, ranked by the
        tokens per round of a row whose answer does not end in the round: a batch call lasts as long as its
        longest row's rounds, and that row ends once (the answers' end hazard, pooled over answers of 2-34 tokens
        on the world, left a chain 8's deepest draft 0.66 of its value)."""
        choices = []
        model = costs.model()
        shares: dict[str, float] = {}
        factors: dict[str, float] = {}  # per kind: its time factor, one for all its shapes
        p = acceptance.probabilities(self.max_depth, max(TOP_KS))  # once for both expectations
        ends = acceptance.with_ends(p)
        expected = self._from_answers(self._accepted(ends), ends, acceptance.answers.chain_tokens(False))
        critical = self._from_answers(self._accepted(p), p, acceptance.answers.chain_tokens(True)) if batch \
            else expected
        for (shape, kind, family), accepted, ahead in zip(self._plan, expected, critical):
            seconds = round_time(model, shape)
            if seconds is None or seconds <= 0:
                continue
            if shape.gamma and family not in shares:
                shares[family] = acceptance.yield_of(family)
            if kind not in factors:
                factors[kind] = costs.time_factor(kind)
            tokens = 1.0 + accepted * shares[family] if shape.gamma else 1.0
            scored = 1.0 + ahead * shares[family] if shape.gamma else 1.0
            realised = seconds * factors[kind]
            choices.append(Choice(shape, rows * scored / realised, tokens, accepted, seconds))
        choices.sort(key=lambda c: -c.predicted_tokens_per_s)
        return choices


def round_time(costs: CostTable | CostModel, shape: Shape) -> float | None:
    """Predicted seconds of one round of ``shape`` (None while a part of it has no timing to go by)."""
    verify = costs.verify_time(shape.kind, shape.width)
    if shape.tree is not None:
        draft = costs.tree_draft_time(shape.tree.top_k, shape.tree.depth)
    else:
        draft = costs.chain_draft_time(shape.gamma) if shape.gamma else 0.0
    if verify is None or draft is None:
        return None
    return verify + draft


class FixedPolicy:
    """Rounds take the given shapes in turn (tests, and ``world-tau --profile``'s wide trees): no calibration,
    no cost model; the acceptance is learned all the same."""

    def __init__(self, shapes: Sequence[Shape | TreeShape | int]):
        if not shapes:
            raise ValueError("FixedPolicy needs at least one shape")
        self.shapes = [s if isinstance(s, Shape) else Shape(s.depth, s) if isinstance(s, TreeShape) else Shape(int(s))
                       for s in shapes]
        self.index = 0

    def next(self) -> Shape:
        shape = self.shapes[self.index % len(self.shapes)]
        self.index += 1
        return shape


@functools.lru_cache(maxsize=64)
def cost_aware_policy(max_tokens: int, max_depth: int, plain: bool, trees: bool) -> CostAwarePolicy:
    """The policy of these options, built once (its only state is a memo of the tables it found calibrated)."""
    return CostAwarePolicy(max_tokens, max_depth, plain, trees)


def hold(ranked: list[Choice], last: Shape | None, margin: float = SWITCH_MARGIN,
         family_moves: bool = True) -> list[Choice]:
    """``ranked`` with ``last`` (the best of the ranking before) moved first unless the best is of its family
    (chains; trees of one top_k: their shares and factors are one; not with ``family_moves`` False) or predicted
    more than ``margin`` faster.

    >>> from hf_specmm.trees import TreeShape
    >>> tree = Shape(4, TreeShape(2, 4, 8))
    >>> a, b, c = Choice(Shape(3), 103.0, 3.0), Choice(tree, 100.0, 3.5), Choice(Shape(4), 101.0, 3.4)
    >>> [x.shape.label for x in hold([a, b], tree)], [x.shape.label for x in hold([a, b], tree, 0.02)]
    (['tree 2,4,8', 'chain 3'], ['chain 3', 'tree 2,4,8'])
    >>> [x.shape.label for x in hold([a, c], Shape(4))]  # one family: the best goes first
    ['chain 3', 'chain 4']
    >>> [x.shape.label for x in hold([a, c], Shape(4), family_moves=False)]
    ['chain 4', 'chain 3']
    """
    kept = next((i for i, c in enumerate(ranked) if c.shape == last), None)
    if not kept or (family_moves and ranked[0].shape.family == ranked[kept].shape.family) or \
            ranked[0].predicted_tokens_per_s > (1.0 + margin) * ranked[kept].predicted_tokens_per_s:
        return ranked
    return [ranked[kept]] + ranked[:kept] + ranked[kept + 1:]


def fit(shape: Shape, room: int) -> Shape:
    """``shape`` cut to ``room`` drafts (near ``max_length``): a shallower tree, a shorter chain, a plain step."""
    if shape.gamma <= room:
        return shape
    if room < 1:
        return PLAIN
    if shape.tree is None:
        return Shape(room)
    return Shape(room, shape.tree.cut(room))
