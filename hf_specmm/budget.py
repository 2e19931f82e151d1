"""How much a drafter may propose: the call's draft budget and the one it gets each round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .trees.expand import TreeShape


@dataclass(frozen=True)
class RoundBudget:
    """What :meth:`~hf_specmm.drafter.Drafter.propose` may draft this round: ``gamma`` tokens per row
    (a chain of γ), or with ``tree`` a draft tree of that shape (its depth is γ)."""

    gamma: int
    tree: TreeShape | None = None


@dataclass
class DraftBudget:
    """The call's budget. ``schedule``: ``constant`` keeps γ fixed; ``heuristic`` / ``heuristic_transient``
    (as stock transformers) add 2 after a round where every row accepted all drafts, else subtract 1 (never
    below 1). ``heuristic`` also writes the final γ back to the draft's ``generation_config`` after the call,
    as stock does, so the next call starts from it; ``heuristic_transient`` starts from the configured γ on
    every call. ``confidence``: ``assistant_confidence_threshold``, a row stops drafting below it.

    Example::

        >>> budget = DraftBudget(gamma=5, schedule="heuristic")
        >>> budget.for_round(remaining=[3, 40], unfinished=[True, True])
        RoundBudget(gamma=5)
        >>> budget.update(kept=[6, 6], gamma_used=5); budget.gamma
        7
    """

    gamma: int
    schedule: str = "constant"
    confidence: float | None = None
    #: every round drafts γ (a static cache's compiled graphs need one block width); drafts past a row's
    #: ``max_length`` are verified but never kept
    fixed_width: bool = False
    #: ``hf_specmm.Tree``'s shape (γ = its depth): each round drafts a tree, cut to the round's γ
    tree: TreeShape | None = None

    def for_round(self, remaining: list[int], unfinished: list[bool]) -> RoundBudget:
        """γ for a round where row i may still add ``remaining[i]`` tokens: one token of the longest
        unfinished row's room is the target's own (with one token left, a plain target step ends the call)."""
        if self.fixed_width:
            return RoundBudget(self.gamma)
        gamma = min(self.gamma, max(r for r, u in zip(remaining, unfinished) if u) - 1)
        return RoundBudget(gamma, self._tree_of_depth(gamma))

    def _tree_of_depth(self, depth: int) -> TreeShape | None:
        """The tree cut to ``depth`` levels (near ``max_length``), with no more nodes than it can hold."""
        if self.tree is None or depth < 1:
            return None
        return self.tree.cut(depth)

    def update(self, kept: list[int], gamma_used: int) -> None:
        """After a round where the rows still running kept ``kept`` tokens each (drafts + the target's)."""
        accepted = [k - 1 for k in kept if k]
        if self.schedule.startswith("heuristic") and accepted:
            self.gamma = self.gamma + 2 if min(accepted) == gamma_used else max(1, self.gamma - 1)

    #: whether the drafter should report which pending tokens were its first choice (:attr:`Proposal.read`)
    needs_first_choices = False

    # hooks for a budget that learns from its rounds (``hf_specmm.Auto``'s); a fixed budget ignores them
    def drafted(self) -> None:
        """The round's drafts are proposed (its verification starts)."""

    def observe(self, proposal: Any, accepted: Any, unfinished: list[bool], kept: list[int],
                stopped: list[bool], rows: list[int] | None = None) -> None:
        """The round's ``proposal`` and the verifier's ``accepted``, per cache row (``unfinished``: rows that
        were generating; ``kept``: the tokens each kept, fewer than accepted + 1 where its end, EOS or
        ``max_length``, came inside the accepted drafts; ``stopped``: rows that ended before ``max_length``;
        ``rows``: the batch row of each cache row, None where they are the same)."""

    def runs_plain(self) -> bool:
        """Whether the call is best run as plain ``generate`` (a budget that measured so; a fixed one never)."""
        return False

    def report(self) -> Any:
        """What the call's rounds did, for :class:`~hf_specmm.stats.SpecStats` (None: nothing to add)."""
        return None
