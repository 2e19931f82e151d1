"""Acceptance by depth and rank: how often the target's token is the draft's r-th choice at depth d, and the
expected accepted length of a chain or a tree under it.

A round tells, for every node on a row's accepted path, which of its children were tried (ranks 0..c-1) and
which one the target took, if any: both verifiers try children in rank order, so each node is a run of hazard
trials. Counting hits and trials per (depth, rank) estimates the hazard h[d][r]; the probability that the
target's token is the r-th choice is ``p[d][r] = h[d][r] · Π_{s<r} (1 − h[d][s])``. Each cell shrinks toward
its rank's pooled hazard over all depths, itself shrunk toward the prior (a profile, else
:data:`PRIOR_HAZARDS`) by :data:`~hf_specmm.auto.costs.PRIOR_ROUNDS` pseudo-trials; every count is discounted
by :data:`~hf_specmm.auto.costs.DISCOUNT` per round, so the table follows a workload that changes.
"""

from __future__ import annotations

from itertools import accumulate
from operator import mul
from typing import Any, Sequence

from .costs import DISCOUNT, PRIOR_ROUNDS

#: a node's hazard before any evidence: rank 0, and every further rank
PRIOR_HAZARDS = (0.5, 0.2)


class AcceptanceTable:
    """Discounted hazard counts per (depth 1..``depth``, rank 0..``ranks`` − 1), deeper depths sharing the last;
    ``hits``, ``trials`` and ``ends`` are stored × ``unit`` (divide to read them)."""

    def __init__(self, depth: int = 8, ranks: int = 8, prior: Sequence[Sequence[float]] | None = None):
        self.depth, self.ranks = depth, ranks
        self.hits = [[0.0] * ranks for _ in range(depth)]
        self.trials = [[0.0] * ranks for _ in range(depth)]
        hazards = [profile_hazards(row, ranks) for row in prior] if prior else \
            [[PRIOR_HAZARDS[0]] + [PRIOR_HAZARDS[1]] * (ranks - 1)]
        self.prior = [hazards[min(d, len(hazards) - 1)] for d in range(depth)]
        self.profiled = bool(prior)  # a profile's depths are evidence of their own; the default prior is not
        self.rounds = 0  # rounds observed (the estimates' version)
        self.ends = [0.0, 0.0]  # answers ended, tokens kept: an answer's chance to end at a token
        self.unit = 1.0  # the newest round's weight: counts are stored × unit, so discounting them is one division

    def observe(self, paths: Sequence[Sequence[tuple[int, int | None]]], ends: int = 0, tokens: int = 0) -> None:
        """One round: per live row, the nodes of its accepted path in depth order, each as (children tried,
        rank taken or None; a chain's node has one child); ``ends`` answers ended among its ``tokens`` kept."""
        self.unit /= DISCOUNT
        if self.unit > 1e100:  # far from overflow: back to a unit of 1
            for cells in (*self.hits, *self.trials, self.ends):
                cells[:] = [v / self.unit for v in cells]
            self.unit = 1.0
        one = self.unit
        self.ends[0], self.ends[1] = self.ends[0] + ends * one, self.ends[1] + tokens * one
        for path in paths:
            for d, (tried, taken) in enumerate(path):
                di = min(d, self.depth - 1)
                for r in range(min(tried if taken is None else taken + 1, self.ranks)):
                    self.trials[di][r] += one
                if taken is not None and taken < self.ranks:
                    self.hits[di][taken] += one
        self.rounds += 1

    def cut_by_ends(self, depth: int) -> list[list[float]]:
        """:meth:`probabilities` × the chance that the answer has not ended before the token (an end cuts as a miss)."""
        keep = 1.0 - self.ends[0] / (self.ends[1] + PRIOR_ROUNDS * self.unit)
        return [[x * keep for x in row] for row in self.probabilities(depth)]

    def probabilities(self, depth: int | None = None, ranks: int | None = None) -> list[list[float]]:
        """``p[d][r]`` (d = 0 is depth 1): the target's token is the draft's r-th choice at depth d + 1."""
        depth, ranks = depth or self.depth, ranks or self.ranks
        pseudo = PRIOR_ROUNDS * self.unit  # the prior's trials in the counts' unit
        pooled = [(hits + pseudo * sum(prior) / self.depth) / (trials + pseudo) for hits, trials, prior in
                  zip(map(sum, zip(*self.hits)), map(sum, zip(*self.trials)), zip(*self.prior))]  # by rank
        table = []
        for d in range(depth):
            di, row, left = min(d, self.depth - 1), [], 1.0
            for r in range(ranks):
                ri = min(r, self.ranks - 1)
                # a given profile's depth pulls as much as the pooled evidence; else a depth barely seen takes the
                # pooled hazard (optimistic if acceptance falls with depth: tried and corrected, never condemned)
                centre = (pooled[ri] + self.prior[di][ri]) / 2.0 if self.profiled else pooled[ri]
                h = (self.hits[di][ri] + pseudo * centre) / (self.trials[di][ri] + pseudo)
                row.append(left * h)
                left *= 1.0 - h
            table.append(row)
        return table

    def as_profile(self, depth: int | None = None, ranks: int | None = None) -> list[list[float]]:
        """:meth:`probabilities` rounded, as ``--acceptance-profile`` and ``Auto(prior=)`` take it."""
        return [[round(p, 4) for p in row] for row in self.probabilities(depth, ranks)]


def profile_hazards(row: Sequence[float], ranks: int) -> list[float]:
    """The hazards h[r] of one depth's probabilities p[r] (padded with the last hazard, capped below 1)."""
    out: list[float] = []
    left = 1.0
    for r in range(ranks):
        h = (min(max(row[r] / left, 0.0), 0.999) if left > 1e-9 else 0.0) if r < len(row) else (out[-1] if out else 0.0)
        out.append(h)
        left *= 1.0 - h
    return out


def chain_lengths(p: Sequence[Sequence[float]], max_gamma: int) -> list[float]:
    """E[accepted drafts] of a chain of γ = 1..``max_gamma``: Σ_{d≤γ} Π_{j≤d} p[j][0]."""
    return list(accumulate(accumulate((p[min(d, len(p) - 1)][0] for d in range(max_gamma)), mul)))


def tree_lengths(p: Sequence[Sequence[float]], top_k: int, max_depth: int, max_nodes: int) -> list[list[float]]:
    """E[accepted drafts] of every tree ``(top_k, depth ≤ max_depth, nodes ≤ max_nodes)`` from one expansion:
    ``out[depth − 1][nodes − 1]``, the sum of the ``nodes`` best candidate values of the first ``depth`` levels
    (EAGLE-2's expansion with each node valued by its path's acceptance probability, Π p along its ranks: each level
    expands the ``top_k`` best candidates of the last; a deeper tree's expansion extends a shallower one's; this is
    Sequoia's objective under EAGLE-2's frontier rule)."""
    out: list[list[float]] = []
    best: list[float] = []  # the max_nodes best candidates so far
    frontier = [1.0]
    for d in range(max_depth):
        row = p[min(d, len(p) - 1)]
        ranks = [row[r] if r < len(row) else row[-1] for r in range(top_k)]
        level = sorted((v * q for v in frontier for q in ranks), reverse=True)
        frontier = level[:top_k]
        best = sorted(best + level, reverse=True)[:max_nodes]
        out.append(list(accumulate(best)))
    return out


def check_profile(profile: Any, what: str) -> None:
    """A profile is a non-empty list of depths, each a non-empty list of probabilities summing to at most 1."""
    if not isinstance(profile, (list, tuple)) or not profile:
        raise ValueError(f"{what} must be a non-empty list of depths, each a list of probabilities by rank")
    for d, row in enumerate(profile, 1):
        if not isinstance(row, (list, tuple)) or not row or not all(
                isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1 for p in row):
            raise ValueError(f"{what}: depth {d} must be a non-empty list of probabilities in [0, 1], got {row!r}")
        if sum(row) > 1 + 1e-6:
            raise ValueError(f"{what}: depth {d}'s probabilities sum to {sum(row):.3f} > 1 (they are exclusive: the "
                             "target's token is at most one rank)")
