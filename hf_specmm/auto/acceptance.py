"""The learned acceptance: how often the target's token is the draft's r-th choice at depth d (Sequoia's
positional acceptance vector, per depth), and the expected accepted length of a chain or a tree under it.

A round tells, for every node on a row's accepted root path (the root included), which of its drafted
children were tried (ranks 0..c-1: a node's children are its draft's best c tokens, in rank order) and which
one the target took, if any. Both verifiers try children in rank order (greedy: the target's argmax is at
most one of them; sampling: EAGLE's rule accepts child r with its target probability after 0..r-1 were
rejected), so each node is a run of *hazard* trials: rank r tried (ranks < r failed), accepted or not.
Counting hits and trials per (depth, rank) is the censored estimate of the hazard h[d][r]; the probability
that the target's token is the r-th choice is then ``p[d][r] = h[d][r] · Π_{s<r} (1 - h[d][s])``.

Estimates shrink toward the pooled hazard of their rank over all depths, itself shrunk toward a prior
(Beta pseudo-counts), so the first rounds and rarely reached depths have sensible values; counts are halved
past a cap, so the table follows a draft whose acceptance drifts.
"""

from __future__ import annotations

import json
from itertools import accumulate
from pathlib import Path
from typing import Any, Sequence

import torch

from .runs import AnswerBook
#: a node's hazard at rank 0 before any evidence (Beta prior mean); ranks beyond: RANK_PRIOR_RATIO of rank 0's
PRIOR_HAZARD = 0.5
RANK_PRIOR_RATIO = 0.4
PRIOR_STRENGTH = 2.0  # pseudo-trials of the pooled prior
DEPTH_STRENGTH = 4.0  # pseudo-trials pulling a depth toward its rank's pooled hazard
COUNT_CAP = 400.0  # trials at one (depth, rank) before its counts are halved
#: pseudo-drafts pulling the pooled realised / expected accepted drafts (every family's rounds) toward 1
YIELD_STRENGTH = 4.0
#: expected drafts pulling one family's realised share toward the pooled one (see :meth:`AcceptanceTable.yield_of`)
FAMILY_STRENGTH = 128.0
YIELD_CAP = 512.0  # expected drafts of one family before its sums are halved
END_PRIOR_TOKENS = 32.0  # kept tokens without an answer's end that the end hazard starts from
END_CAP = 2000.0  # kept tokens before the end counts are halved


class AcceptanceTable:
    """Hazard counts per (depth 1..``depth``, rank 0..``ranks``-1); deeper depths share the last row."""

    def __init__(self, depth: int = 16, ranks: int = 8, prior: Sequence[Sequence[float]] | None = None):
        self.depth, self.ranks = depth, ranks
        self.hits = [[0.0] * ranks for _ in range(depth)]
        self.trials = [[0.0] * ranks for _ in range(depth)]
        self.prior = [PRIOR_HAZARD] * ranks  # per rank: set_prior's pooled profile (rank 0 only used without one)
        self.depth_prior: list[list[float]] | None = None
        if prior is not None:
            self.set_prior(prior)
        self.rounds = 0
        self.clock = 0  # rounds of this pair's calls, plain steps included (AutoBudget.ranking's clock)
        #: plain rounds between two probes once plain steps win (doubles once a turn of probes lost; AutoBudget._probe)
        self.probe_gap = 8
        #: the shape of the last probe if it realised more tokens per second than the plain steps before it:
        #: the next round probes it again (AutoBudget._choose), its timings the cost curves' evidence
        self.probe_won: Any = None
        self.probes_lost = 0  # evaluated probes in a row that realised less than plain steps (AutoBudget.runs_plain)
        self.probe_turn = 0  # probes so far: the best drafted shape's turn or the other kind's (AutoBudget._probe)
        #: per cost table (a batch bucket's): [drafted rounds its ranking chose since its last exploration,
        #: explorations so far: whose turn it is among its contenders] (AutoBudget._contender)
        self.exploring: dict[Any, list[int]] = {}
        #: per cost table (a batch bucket's), the whole calls' choice there (:class:`~hf_specmm.auto.calls.Regime`)
        self.regimes: dict[Any, Any] = {}
        self.plain_ranking: tuple | None = None  # (tables' state, best shape) of the last check
        #: per family ('chain', 'tree k'): [drafts kept, drafts expected] (see :meth:`yield_of`)
        self.yields: dict[str, list[float]] = {}
        self.ends = [0.0, 0.0]  # answers that ended before max_length, tokens kept (see end_hazard)
        #: per cost table (a batch bucket's), the last ranking of the candidate shapes, shared by this pair's calls
        #: (AutoBudget.ranking): a batch call whose rows finish moves through the buckets every call
        self.rankings: dict[Any, dict] = {}
        #: the recent answers' hard tokens: the rounds each chain takes over them (:mod:`hf_specmm.auto.runs`)
        self.answers = AnswerBook(depth)

    def set_prior(self, profile: Sequence[Sequence[float]]) -> None:
        """Prior from a profile ``profile[d][r]`` = P(the target's token is the r-th choice at depth d + 1)."""
        hazards = [profile_hazards(row, self.ranks) for row in profile]
        self.depth_prior = [hazards[min(d, len(hazards) - 1)] for d in range(self.depth)]
        self.prior = [sum(h[r] for h in hazards) / len(hazards) for r in range(self.ranks)]

    # ---- evidence --------------------------------------------------------------------------------------
    def observe(self, depth: int, tried: int, accepted_rank: int | None) -> None:
        """A node at depth ``depth - 1`` had children of ranks 0..``tried``-1; the target took ``accepted_rank``
        (None: none of them)."""
        d = min(depth, self.depth) - 1
        last = tried if accepted_rank is None else accepted_rank + 1
        for r in range(min(last, self.ranks)):
            self.trials[d][r] += 1.0
            if self.trials[d][r] > COUNT_CAP:
                self.trials[d][r] /= 2.0
                self.hits[d][r] /= 2.0
        if accepted_rank is not None and accepted_rank < self.ranks:
            self.hits[d][accepted_rank] += 1.0

    def observe_chain(self, accepted: Sequence[int], drafted: Sequence[int]) -> None:
        """Rows that drafted ``drafted[i]`` tokens in a chain and had ``accepted[i]`` of them accepted."""
        for n, g in zip(accepted, drafted):
            for d in range(1, min(n + 1, g) + 1):
                self.observe(d, 1, 0 if d <= n else None)
        self.rounds += 1

    def observe_tree(self, accepted: Sequence[int], children: Sequence[Sequence[int]],
                     ranks: Sequence[Sequence[int]], ended: Sequence[bool] | None = None) -> None:
        """Per row: ``accepted`` nodes n, ``children[j]`` valid children of the j-th path node (j = 0 the
        root), ``ranks[j]`` the rank of the (j+1)-th path node among them (read for j < n); ``ended[i]``: the
        row's answer ended at its n-th node (nothing past it was a trial)."""
        for i, (n, counts, taken) in enumerate(zip(accepted, children, ranks)):
            for j in range(n if ended is not None and ended[i] else n + 1):
                if j < len(counts) and counts[j] > 0:
                    self.observe(j + 1, counts[j], taken[j] if j < n else None)
        self.rounds += 1

    def observe_ends(self, tokens: float, ended: int) -> None:
        """A round's live rows kept ``tokens`` tokens and ``ended`` of them ended their answer (EOS, a stop
        string: not ``max_length``, which the rounds' shapes are cut to)."""
        self.ends[0] += ended
        self.ends[1] += tokens
        if self.ends[1] > END_CAP:
            self.ends = [self.ends[0] / 2.0, self.ends[1] / 2.0]

    def end_hazard(self) -> float:
        """λ: the probability that a kept token is its answer's last (answers that end taken as geometric)."""
        return self.ends[0] / (self.ends[1] + END_PRIOR_TOKENS)

    def observe_yield(self, family: str, expected: float, kept: float) -> None:
        """A round of a shape of ``family`` whose rows kept ``kept`` drafts each on average where the table
        expected ``expected`` (both without the target's own token)."""
        sums = self.yields.setdefault(family, [0.0, 0.0])
        sums[0] += kept
        sums[1] += expected
        if sums[1] > YIELD_CAP:
            sums[0] /= 2.0
            sums[1] /= 2.0

    def yield_of(self, family: str) -> float:
        """Drafts a round of a shape of ``family`` (chains; trees of one top_k) keeps per draft the table expects.
        The table is a marginal over contexts and positions: a draft whose confidence ranks a tree's nodes well
        beats it, a poorly calibrated one falls short, and answers' ends are a geometric guess
        (:meth:`end_hazard`). Most of that is one share for every shape (:meth:`pooled_yield`); a family's own
        departure from it is learned from that family's rounds, shrunk toward the pooled share by
        :data:`FAMILY_STRENGTH` expected drafts. Shrunk only toward 1, a family known from a few explored rounds
        took whatever they happened to keep: on the shipped world an image-adapter draft's chains came out at
        0.65 from 15 rounds where six passes of each chain kept 0.86-0.96 (trees 0.87-0.94), and Auto drafted
        trees of top_k 4 (tree 4,6,24 runs at 0.82x the best chain's tokens per second). Per family, not per
        shape: what separates two chains of one draft is their depth, which the table has."""
        kept, expected = self.yields.get(family, (0.0, 0.0))
        return (kept + FAMILY_STRENGTH * self.pooled_yield()) / (expected + FAMILY_STRENGTH)

    def pooled_yield(self) -> float:
        """Drafts kept per draft the table expects, over every family's rounds, shrunk toward 1."""
        kept = sum(v[0] for v in self.yields.values())
        expected = sum(v[1] for v in self.yields.values())
        return (kept + YIELD_STRENGTH) / (expected + YIELD_STRENGTH)

    # ---- estimates -------------------------------------------------------------------------------------
    def pooled_hazard(self, rank: int, prior: float | None = None) -> float:
        """Rank ``rank``'s hazard over all depths. Without a given prior, a rank beyond the first is expected to
        be taken :data:`RANK_PRIOR_RATIO` as often as the first (a draft whose first choice is never right
        rarely has the right second one; chains never show the second)."""
        if prior is None:
            prior = self.prior[0] if rank == 0 else RANK_PRIOR_RATIO * self.pooled_hazard(0)
        return _pool(self._rank_counts(rank), prior)

    def _rank_counts(self, rank: int) -> tuple[float, float]:
        """Rank ``rank``'s hits and trials summed over all depths (what :meth:`pooled_hazard` pools)."""
        return sum(row[rank] for row in self.hits), sum(row[rank] for row in self.trials)

    def hazard(self, depth: int, rank: int) -> float:
        d = min(depth, self.depth) - 1
        r = min(rank, self.ranks - 1)
        given = None if self.depth_prior is None else self.depth_prior[d][r]
        pooled = self.pooled_hazard(r, given)
        return (self.hits[d][r] + DEPTH_STRENGTH * pooled) / (self.trials[d][r] + DEPTH_STRENGTH)

    def probabilities(self, depth: int | None = None, ranks: int | None = None) -> list[list[float]]:
        """``p[d][r]`` (d = 0 is depth 1): the probability that the target's token is the draft's r-th choice
        at depth d + 1, given the path to it was accepted."""
        depth, ranks = depth or self.depth, ranks or self.ranks
        # each rank's counts summed once, not once per cell (a ranking reads this table on the decoding path)
        used = range(min(ranks, self.ranks))
        pooled = [self.pooled_hazard(r) for r in used] if self.depth_prior is None else None
        counts = [self._rank_counts(r) for r in used] if pooled is None else []
        table = []
        for d in range(1, depth + 1):
            di = min(d, self.depth) - 1
            hits, trials = self.hits[di], self.trials[di]
            row, left = [], 1.0
            for r in range(ranks):
                ri = min(r, self.ranks - 1)
                prior = pooled[ri] if pooled is not None else _pool(counts[ri], self.depth_prior[di][ri])
                h = (hits[ri] + DEPTH_STRENGTH * prior) / (trials[ri] + DEPTH_STRENGTH)
                row.append(left * h)
                left *= 1.0 - h
            table.append(row)
        return table

    def kept_probabilities(self, depth: int | None = None, ranks: int | None = None) -> list[list[float]]:
        """:meth:`probabilities` with the answer's end: a draft at depth d is kept if the target takes it and the
        answer did not end at one of the d - 1 tokens before it, (1 - λ)^(d - 1) with λ the :meth:`end_hazard`
        — so a node's path value (Π p along it) carries the end, and a shape reaching past answers that end
        soon expects that much less. (The table itself counts no trial past an answer's end.)"""
        return self.with_ends(self.probabilities(depth, ranks))

    def with_ends(self, p: Sequence[Sequence[float]]) -> list[list[float]]:
        """:meth:`probabilities`' table ``p`` with the answer's end (see :meth:`kept_probabilities`): a ranking
        needs both, and computes ``p`` once."""
        keep = 1.0 - self.end_hazard()
        return [[v * (keep if d else 1.0) for v in row] for d, row in enumerate(p)]

    def as_profile(self, depth: int | None = None, ranks: int | None = None) -> list[list[float]]:
        """:meth:`probabilities` rounded, as ``--acceptance-profile`` and :meth:`set_prior` take it."""
        return [[round(p, 4) for p in row] for row in self.probabilities(depth, ranks)]


def _pool(counts: tuple[float, float], prior: float) -> float:
    """A hazard from (hits, trials) shrunk toward ``prior`` by :data:`PRIOR_STRENGTH` pseudo-trials."""
    hits, trials = counts
    return (hits + PRIOR_STRENGTH * prior) / (trials + PRIOR_STRENGTH)


def profile_hazards(row: Sequence[float], ranks: int) -> list[float]:
    """The hazards h[r] of one depth's probabilities p[r] (padded with the last hazard, capped below 1)."""
    out, left = [], 1.0
    for r in range(ranks):
        if r < len(row):
            h = min(max(row[r] / left, 0.0), 0.999) if left > 1e-9 else 0.0
        else:
            h = out[-1] if out else 0.0
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


def tree_lengths(p: Sequence[Sequence[float]], top_k: int, max_depth: int,
                 nodes: Sequence[int]) -> dict[tuple[int, int], float]:
    """E[accepted drafts] of ``Tree(top_k, depth, N)`` for depth 2..``max_depth`` and N in ``nodes`` (each
    ≤ the expansion's candidates). The expansion is emulated as :func:`hf_specmm.trees.expand.expand_tree`
    runs it, with each node valued by its path's acceptance probability (Π p along its ranks): the root's
    ``top_k`` children, then the ``top_k`` best of each level expanded, the N best of all kept. A node's value
    is the probability that it is on the accepted path, so the sum of the kept values is E[accepted]
    (Sequoia's objective, under EAGLE-2's frontier rule)."""
    out: dict[tuple[int, int], float] = {}
    best: list[float] = []  # the max(nodes) largest values so far, largest first (no other is ever kept)
    prefix = [0.0]  # prefix[n]: the n best values summed, largest first
    expanded = 0  # nodes so far
    frontier = [1.0]
    most = max(nodes)
    for depth in range(1, max_depth + 1):
        row = p[min(depth - 1, len(p) - 1)]
        factors = list(row[:top_k]) + [row[-1]] * (top_k - len(row))  # ranks past the row's: its last
        level = sorted([v * f for v in frontier for f in factors], reverse=True)
        frontier = level[:top_k]
        expanded += len(level)
        # the level merged into the best (two descending runs: timsort merges them) unless none of it gets in, not
        # every value sorted again: the same values in the same order, so the sums add them as a full sort would
        if level and (len(best) < most or level[0] > best[-1]):
            best = sorted(best + level, reverse=True)[:most]
            prefix = list(accumulate(best, initial=0.0))
        if depth < 2:
            continue
        for n in nodes:
            if n <= expanded:
                out[(depth, n)] = prefix[n]  # n ≤ most: the nodes' largest
    return out


def tree_observations(tree: object, n: torch.Tensor, path: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
    """For each row: the valid children of each node on its accepted path and the next path node's rank among
    them (device-side, one transfer). ``tree``: the round's :class:`~hf_specmm.trees.DraftTree`."""
    parents, valid = tree.parents, tree.valid  # type: ignore[attr-defined]
    path = path.to(parents.device)
    nodes = torch.arange(parents.shape[1], device=parents.device)
    child_of = (parents[:, None, :] == path[:, :, None]) & valid[:, None, :] & (nodes > 0)  # [A, D+1, N+1]
    counts = child_of.sum(-1)
    ranks = (child_of[:, :-1] & (nodes[None, None, :] < path[:, 1:, None])).sum(-1)
    return counts.tolist(), ranks.tolist()


def read_profile(text: str) -> list[list[float]]:
    """A profile from ``"p11,p12,...;p21,..."`` (depths split by ``;``, ranks by ``,``) or from a JSON file (a
    list of depths, or an object with a ``"profile"`` list: what ``hf-specmm world-tau --profile`` writes)."""
    if Path(text).suffix == ".json" or _is_file(text):
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


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except OSError:  # not a path this system can name (too long): the text itself
        return False
