"""``hf_specmm.Auto``: each round takes the shape (plain step, chain, tree) with the highest expected tokens per
second on the hardware at hand, from measured costs and learned acceptance (docs/auto.md)."""

from __future__ import annotations

import os
import weakref
from typing import Any, Sequence

import torch

from ..devices import execution_device
from ..drafts.wrapper import DraftWrapper, Tree
from ..trees.expand import TreeShape
from .acceptance import AcceptanceTable
from .budget import AutoBudget
from .costs import CostTable
from .policy import CostAwarePolicy, FixedPolicy, Shape, cost_aware_policy
from .store import COSTS, batch_bucket, cost_key


#: the learned acceptance per (target, draft) pair, weakly held: {target: {draft: {sampling: AcceptanceTable}}}
_ACCEPTANCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Auto(DraftWrapper):
    """Wraps any draft (text-only, image-adapter, vlm, feature head, ``TextOnly(...)``) so that every round
    drafts the shape with the highest expected tokens per second: a plain target step (nothing drafted), a
    chain of γ ≤ ``max_depth`` or a tree (top_k 2/4/8, depth ≤ ``max_depth``, at most ``max_tokens`` nodes).

    The expectation is E[tokens per round] / E[seconds per round]:

    - **costs, measured**: the target's verification time by block width and the draft's time per shape,
      timed on the real rounds of the first call for each (target, draft, device, dtype, batch bucket, cache
      kind) — its first rounds take calibration shapes, a run of rounds each — then kept up to date by every
      round, for the process (and in ``costs_file``, a JSON file, when given: loaded before the first call,
      written once a calibration completes);
    - **acceptance, learned**: how often the target's token is the draft's r-th choice at depth d, updated
      from every round's verification and kept across calls for this (target, draft) pair (for the process,
      whichever ``Auto`` wraps the draft), greedy and sampling apart; ``prior``: a profile ``prior[d][r]`` (as ``hf-specmm world-tau --profile`` writes) for
      the first rounds, else a neutral prior.

    Where nothing drafted pays (a useless draft, a draft as costly as the target, an overhead-bound machine)
    rounds are plain target steps, with a rare probe of the best drafted shape. Outputs are those of plain
    ``generate``: each round is verified as a fixed chain or tree would be (greedy identical; sampling keeps
    the target's distribution: a round's shape depends only on earlier rounds). ``last_stats(model).auto``
    reports the shapes taken and the predicted and measured tokens per second.

    ``shapes``: rounds take these shapes in turn instead (ints: chains, 0 a plain step; ``TreeShape``: trees),
    for tests and for measuring an acceptance profile; the acceptance is learned all the same.

    Refused before any work, naming the option: ``num_assistant_tokens`` (Auto chooses γ: use ``max_depth``),
    ``num_assistant_tokens_schedule`` other than ``'constant'``, ``assistant_confidence_threshold``,
    ``cache_implementation='static'``. With ``output_attentions`` / ``output_hidden_states`` and
    ``return_dict_in_generate`` only plain steps and chains are taken (a tree forward's per-node tensors have
    no plain-generate layout).

    Example::

        >>> import hf_specmm
        >>> from hf_specmm import testing
        >>> auto = hf_specmm.Auto(testing.text_draft_from_target(testing.tiny_target("llava")), max_tokens=32)
        >>> auto.max_tokens, auto.max_depth
        (32, 8)
    """

    wrapped_name = "draft"

    def __init__(self, draft: torch.nn.Module, max_tokens: int = 64, max_depth: int = 8,
                 costs_file: str | os.PathLike | None = None, prior: Sequence[Sequence[float]] | None = None,
                 shapes: Sequence[int | TreeShape] | None = None):
        super().__init__()
        if isinstance(draft, (Auto, Tree)):
            raise ValueError(f"Auto(draft): draft is already a {type(draft).__name__}; wrap the draft itself once")
        if not isinstance(draft, torch.nn.Module):
            raise TypeError(f"Auto(draft): draft must be a draft model (torch.nn.Module), got {type(draft).__name__}")
        for name, value, low in (("max_tokens", max_tokens, 1), ("max_depth", max_depth, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Auto {name} must be an integer >= {low}, got {value!r}")
        if prior is not None:
            check_profile(prior, "Auto prior")
        self.draft = draft
        self.max_tokens, self.max_depth = max_tokens, max_depth
        self.costs_file, self.prior = costs_file, [list(map(float, row)) for row in prior] if prior else None
        self.shapes = None if shapes is None else list(FixedPolicy(shapes).shapes)  # checked here
        if self.shapes is not None:
            for s in self.shapes:
                if s.gamma < 0 or (s.tree is None and s.gamma > max_tokens) or (s.tree and s.tree.nodes > max_tokens):
                    raise ValueError(f"Auto shapes: {s.label} drafts more than max_tokens={max_tokens}")

    def acceptance(self, target: Any, sampling: bool = False) -> AcceptanceTable:
        """The acceptance learned for ``target`` with this draft (greedy or ``sampling``), for the process: every
        ``Auto`` around the same draft shares it (the first one's ``prior`` starts it)."""
        tables = _ACCEPTANCE.setdefault(target, weakref.WeakKeyDictionary()).setdefault(self.draft, {})
        if sampling not in tables:
            tables[sampling] = AcceptanceTable(depth=max(self.max_depth, 1), ranks=8, prior=self.prior)
        return tables[sampling]

    def budget(self, target: Any, batch: int, sampling: bool, cache: str, trees: bool, plain: bool,
               device: torch.device, answers: bool = False) -> AutoBudget:
        """The call's budget: the policy, this pair's acceptance, the cost table of the call's key. ``answers``:
        the draft misses a token whatever depth drafts it (:attr:`~hf_specmm.drafter.Drafter.misses_by_token`): its
        rounds record the answers' hard tokens, whose rounds rank chains (:mod:`hf_specmm.auto.runs`)."""
        draft_device = execution_device(self.draft)
        dtype, path = getattr(target, "dtype", None), self.costs_file

        known: dict[int, tuple[str, CostTable]] = {}  # by batch bucket: asked every round

        def tables(rows: int) -> tuple[str, CostTable]:  # the cost table of a round's live rows' batch bucket
            bucket = batch_bucket(rows)
            if bucket not in known:
                key = cost_key(target, self.draft, device, dtype, rows, cache)
                known[bucket] = key, COSTS.table(key, path)
            return known[bucket]

        if self.shapes is not None:
            policy: CostAwarePolicy | FixedPolicy = FixedPolicy(self.shapes)
        else:
            policy = cost_aware_policy(self.max_tokens, self.max_depth, plain, trees)
        save = None if path is None else (lambda keys: COSTS.save(path, keys))
        return AutoBudget(policy, self.acceptance(target, sampling), tables, batch, (device, draft_device), save,
                          answers=answers, first_choices=not sampling)

    def uses(self, trees: bool, plain: bool) -> str | None:
        """Why this Auto cannot run with trees / plain steps unavailable (its fixed ``shapes`` need them)."""
        for s in self.shapes or ():
            if s.tree is not None and not trees:
                return f"shape {s.label} is a tree"
            if s.gamma == 0 and not plain:
                return "shape 'plain' needs plain steps"
        return None


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


__all__ = ["Auto", "Shape", "check_profile"]
