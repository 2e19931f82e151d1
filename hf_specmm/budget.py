"""How much a drafter may propose: the call's draft budget and the one it gets each round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .trees.expand import TreeShape


@dataclass(frozen=True)
class RoundBudget:
    """What :meth:`~hf_specmm.drafter.Drafter.propose` may draft this round: ``gamma`` tokens per row
    (a chain of γ), or with ``tree`` a draft tree of that shape (its depth is γ)."""

    gamma: int
    tree: TreeShape | None = None


@dataclass(frozen=True)
class RoundOutcome:
    """What a round did, per batch row (the one numbering a budget sees): ``live`` (generating at its start),
    ``kept`` tokens (drafts + the target's; fewer than ``accepted`` + 1 where the row's end came inside its
    accepted drafts), ``accepted`` drafts, ``drafted`` drafts, ``ended`` (the row's answer ended in the round:
    EOS or a stop, not ``max_length``); after the round, the tokens each row may still add (``remaining``) and
    whether it is still ``unfinished`` (the next round's live rows). ``gamma``: the drafted depth (0: a plain
    step); ``tree_paths``: for a tree round, per batch row the (children, rank taken) of each node on its accepted
    path, computed when asked."""

    gamma: int
    live: list[bool]
    kept: list[int]
    accepted: list[int]
    drafted: list[int]
    ended: list[bool]
    remaining: list[int]
    unfinished: list[bool]
    tree_paths: Callable[[], list[list[tuple[int, int]]]] | None = None

    def paths(self) -> list[list[tuple[int, int | None]]]:
        """Per live row, the nodes of its accepted path in depth order as (children tried, rank taken or None); a
        row whose end came inside its accepted drafts stops there (nothing drafted past an end is a trial)."""
        trees = self.tree_paths() if self.tree_paths is not None else None
        out: list[list[tuple[int, int | None]]] = []
        for i, live in enumerate(self.live):
            if not live:
                continue
            n, ended = self.accepted[i], self.kept[i] <= self.accepted[i]
            taken = self.kept[i] if ended else n
            if trees is None:
                path: list[tuple[int, int | None]] = [(1, 0)] * taken
                if not ended and taken < self.drafted[i]:
                    path.append((1, None))
            else:
                nodes = trees[i]
                path = [(c, r) for c, r in nodes[:taken] if c > 0]
                if not ended and taken < len(nodes) and nodes[taken][0] > 0:
                    path.append((nodes[taken][0], None))
            out.append(path)
        return out


@dataclass(frozen=True)
class CallContext:
    """What a draft wrapper that shapes rounds (``hf_specmm.Tree``, ``hf_specmm.Auto``) reads to build the call's
    budget (its ``call_budget(budget, call)``, which refuses what it cannot honour before any forward): the target,
    the draft's kind, the resolved generation config, where the caller set ``num_assistant_tokens`` (None:
    nowhere), the target's vocabulary, which model has linear-attention layers ('target', 'draft', None), the
    batch size and the device."""

    target: Any
    kind: Any
    config: Any
    gamma_source: str | None
    vocab_size: int
    stateful: str | None
    batch: int
    device: Any


@dataclass
class DraftBudget:
    """The call's budget. ``schedule``: ``constant`` keeps γ fixed; ``heuristic`` / ``heuristic_transient``
    (as stock transformers) add 2 after a round where every row accepted all drafts, else subtract 1 (never
    below 1). ``heuristic`` also writes the final γ back to the draft's ``generation_config`` after the call,
    as stock does, so the next call starts from it; ``heuristic_transient`` starts from the configured γ on
    every call. ``confidence``: ``assistant_confidence_threshold``, a row stops drafting below it.

    The loop asks :meth:`start` once, after the prefill, for the first round's :class:`RoundBudget`, and tells
    :meth:`close` each round's :class:`RoundOutcome` at its end, which returns the next round's (None once every
    row has finished); ``generate`` asks :meth:`runs_plain` before the call and :meth:`report` after it. A budget
    that learns (``hf_specmm.Auto``'s) overrides them.

    Example::

        >>> budget = DraftBudget(gamma=5, schedule="heuristic")
        >>> budget.start(remaining=[30, 40], unfinished=[True, True])
        RoundBudget(gamma=5, tree=None)
        >>> budget.close(RoundOutcome(gamma=5, live=[True, True], kept=[6, 6], accepted=[5, 5], drafted=[5, 5],
        ...                           ended=[False, False], remaining=[24, 34], unfinished=[True, True]))
        RoundBudget(gamma=7, tree=None)
        >>> budget.close(RoundOutcome(gamma=7, live=[True, True], kept=[3, 8], accepted=[2, 7], drafted=[7, 7],
        ...                           ended=[True, False], remaining=[21, 3], unfinished=[False, True]))
        RoundBudget(gamma=2, tree=None)
        >>> budget.gamma  # a row kept fewer than all its drafts: 7 - 1 (that round cut to the room left, 3 - 1)
        6
    """

    gamma: int
    schedule: str = "constant"
    confidence: float | None = None
    #: every round drafts γ (a static cache's compiled graphs need one block width); drafts past a row's
    #: ``max_length`` are verified but never kept
    fixed_width: bool = False
    #: ``hf_specmm.Tree``'s shape (γ = its depth): each round drafts a tree, cut to the round's γ
    tree: TreeShape | None = None

    def start(self, remaining: list[int], unfinished: list[bool]) -> RoundBudget | None:
        """The call's first round, asked once after the prefill (None: no row is unfinished): :meth:`plan`."""
        return self.plan(remaining, unfinished) if any(unfinished) else None

    def close(self, outcome: RoundOutcome) -> RoundBudget | None:
        """A round's end: the heuristic schedules move γ by whether every live row kept all its drafts; returns the
        next round's budget for the rows the outcome leaves (None: every row has finished)."""
        accepted = [k - 1 for k, u in zip(outcome.kept, outcome.live) if u and k]
        if self.schedule.startswith("heuristic") and accepted:
            self.gamma = self.gamma + 2 if min(accepted) == outcome.gamma else max(1, self.gamma - 1)
        return self.plan(outcome.remaining, outcome.unfinished) if any(outcome.unfinished) else None

    def plan(self, remaining: list[int], unfinished: list[bool]) -> RoundBudget:
        """γ for a round where row i may still add ``remaining[i]`` tokens (:meth:`start` and :meth:`close` ask it,
        with a row unfinished): one token of the longest unfinished row's room is the target's own (with one token
        left, a plain target step ends the call)."""
        if self.fixed_width:
            return RoundBudget(self.gamma)
        gamma = min(self.gamma, max(r for r, u in zip(remaining, unfinished) if u) - 1)
        return RoundBudget(gamma, self.tree.cut(gamma) if self.tree is not None and gamma >= 1 else None)

    def runs_plain(self) -> bool:
        """Whether the call is best run as plain ``generate`` (a budget that measured so; a fixed one never)."""
        return False

    def close_plain_call(self, steps: int, rows: int) -> None:
        """The call ran as plain ``generate``: ``steps`` decoding steps over ``rows`` rows."""

    def report(self) -> Any:
        """What the call's rounds did, for :class:`~hf_specmm.stats.SpecStats` (None: nothing to add)."""
        return None
