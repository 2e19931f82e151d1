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

import json
import os
from pathlib import Path
from typing import Any, Sequence

from .costs import DISCOUNT, PRIOR_ROUNDS

#: a node's hazard before any evidence: rank 0, and every further rank
PRIOR_HAZARDS = (0.5, 0.2)


class AcceptanceTable:
    """Discounted hazard counts per (depth 1..``depth``, rank 0..``ranks`` − 1); deeper depths share the last."""

    def __init__(self, depth: int = 8, ranks: int = 8, prior: Sequence[Sequence[float]] | None = None):
        self.depth, self.ranks = depth, ranks
        self.hits = [[0.0] * ranks for _ in range(depth)]
        self.trials = [[0.0] * ranks for _ in range(depth)]
        hazards = [profile_hazards(row, ranks) for row in prior] if prior else \
            [[PRIOR_HAZARDS[0]] + [PRIOR_HAZARDS[1]] * (ranks - 1)]
        self.prior = [hazards[min(d, len(hazards) - 1)] for d in range(depth)]
        self.profiled = bool(prior)  # a profile's depths are evidence of their own; the default prior is not
        self.rounds = 0  # rounds observed (the estimates' version)

    def observe(self, paths: Sequence[Sequence[tuple[int, int | None]]]) -> None:
        """One round: per live row, the nodes of its accepted path in depth order, each as (children tried,
        rank taken or None). A chain's node has one child."""
        for row in (self.hits, self.trials):
            for cells in row:
                cells[:] = [v * DISCOUNT for v in cells]
        for path in paths:
            for d, (tried, taken) in enumerate(path):
                di = min(d, self.depth - 1)
                for r in range(min(tried if taken is None else taken + 1, self.ranks)):
                    self.trials[di][r] += 1.0
                if taken is not None and taken < self.ranks:
                    self.hits[di][taken] += 1.0
        self.rounds += 1

    def probabilities(self, depth: int | None = None, ranks: int | None = None) -> list[list[float]]:
        """``p[d][r]`` (d = 0 is depth 1): the target's token is the draft's r-th choice at depth d + 1."""
        depth, ranks = depth or self.depth, ranks or self.ranks
        pooled = []
        for r in range(self.ranks):
            hits, trials = sum(row[r] for row in self.hits), sum(row[r] for row in self.trials)
            prior = sum(p[r] for p in self.prior) / self.depth
            pooled.append((hits + PRIOR_ROUNDS * prior) / (trials + PRIOR_ROUNDS))
        table = []
        for d in range(depth):
            di, row, left = min(d, self.depth - 1), [], 1.0
            for r in range(ranks):
                ri = min(r, self.ranks - 1)
                # a given profile's depth pulls as much as the pooled evidence; else a depth barely seen takes the
                # pooled hazard (optimistic if acceptance falls with depth: tried and corrected, never condemned)
                centre = (pooled[ri] + self.prior[di][ri]) / 2.0 if self.profiled else pooled[ri]
                h = (self.hits[di][ri] + PRIOR_ROUNDS * centre) / (self.trials[di][ri] + PRIOR_ROUNDS)
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
    out, path, total = [], 1.0, 0.0
    for d in range(max_gamma):
        path *= p[min(d, len(p) - 1)][0]
        total += path
        out.append(total)
    return out


def tree_nodes(p: Sequence[Sequence[float]], top_k: int, depth: int, nodes: int) -> list[tuple[int, int, float]]:
    """The tree ``(top_k, depth, nodes)`` as the EAGLE-2 expansion keeps it when each node is valued by its path's
    acceptance probability (Π p along its ranks): (parent index or −1, rank, value) per kept node, parents first.
    The sum of the values is E[accepted drafts] (Sequoia's objective under EAGLE-2's frontier rule)."""
    found: list[tuple[int, int, float]] = []  # every candidate: (parent, rank, value)
    frontier = [(-1, 1.0)]
    for d in range(depth):
        row = p[min(d, len(p) - 1)]
        level = []
        for parent, value in frontier:
            for r in range(top_k):
                level.append((parent, r, value * (row[r] if r < len(row) else row[-1])))
        start = len(found)
        found += level
        order = sorted(range(len(level)), key=lambda i: -level[i][2])[:top_k]
        frontier = [(start + i, level[i][2]) for i in order]
    keep = sorted(sorted(range(len(found)), key=lambda i: -found[i][2])[:nodes])  # ties: earlier first
    index = {old: new for new, old in enumerate(keep)}
    return [(index.get(found[i][0], -1), found[i][1], found[i][2]) for i in keep]


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


def read_profile(text: str) -> list[list[float]]:
    """A profile from ``"p11,p12,...;p21,..."`` (depths split by ``;``, ranks by ``,``) or from a JSON file (a
    list of depths, or an object with a ``"profile"`` list: what ``hf-specmm world-tau --profile`` writes)."""
    if Path(text).suffix == ".json" or os.path.isfile(text):  # isfile: False for names too long to be paths
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"profile file {text!r} does not exist")
        data: Any = json.loads(path.read_text())
        profile = data.get("profile") if isinstance(data, dict) else data
        if not isinstance(profile, list):
            raise ValueError(f"profile file {text!r} holds no profile (a list of depths, or {{'profile': [...]}})")
        return [[float(p) for p in row] for row in profile]
    try:
        return [[float(p) for p in depth.split(",") if p.strip()] for depth in text.split(";") if depth.strip()]
    except ValueError:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ValueError(f"expected probabilities by rank, depths split by ';' (e.g. 0.7,0.1;0.6,0.1) or a .json "
                         f"file, got {shown!r}") from None

