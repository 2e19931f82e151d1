"""``CachedDrafter``: the base of every drafter in the loop that drafts from a cache, one round at a time.

A cached drafter drafts from a context it keeps between rounds: ``state``, its cache (its own
:class:`~hf_specmm.caches.SlottedCache` for an LM or a feature head; the target features' keys / values for a
DFlash block drafter; None for a Gemma 4 assistant, whose context is the target's own cache, rolled back by
the loop), ``pending``, the slots it has not read yet (the target's tokens or features since its last round),
and ``root``, the target's newest token (the next tree's root). Every round has the same life, written once
here::

    propose(budget, select)
        start = begin_round(γ)                              # RoundStart(state.length, pending width), or None
        root logits = read_pending()                        # ONE forward over the pending slots
        chain:  d_j = select(logits, j); logits = read_draft(d_j)     (γ - 1 reads; d_γ is read next round)
        tree:   expand_tree(root, root logits, step)        # step = tree_levels(shape): one read per level
    accept(proposal, keep, next_tokens, path)
        state.rollback(start, pending + the kept drafts it read, in path order)      (a state of its own only)
        root = next_tokens; queue(...)                      # the next round's pending slots
    follow(next_tokens)                                     # a plain target step: queue, read next round
    select_rows(keep)                                       # finished rows leave: state, pending, root

A subclass supplies only what it reads:

- :meth:`read_pending` (the pending slots → the root's logits [A, V]) and :meth:`read_draft` (one drafted token
  → the next logits [A, V]);
- for trees, :meth:`read_level` (a level of K nodes in one forward with the 4-D mask and positions it is given
  → logits [A, K, V]), or, for a drafter whose levels need no mask of this class's making, its own
  :meth:`tree_levels` (a block drafter reads level d from the block it already computed);
- :meth:`queue`: after the rollback, the next round's ``pending`` (an LM queues ``next_tokens``; a feature head
  or a block drafter the verification's true features of every kept token; an assistant the target's hidden
  state at the last kept one);
- :meth:`follow`, and :meth:`prefill` (build ``state``, read the prompt, set ``pending`` and ``root``).

``pending`` is a tuple of per-row tensors, each [A, k, ...] with the slots along dimension 1 and ``valid``
[A, k] bool last (left-padded rows hold masked holes); :meth:`select_rows` selects every one of them.
``keeps_read_drafts``: whether the drafts it read stay in its cache when accepted (an LM's do: they are what it
would read again; a feature head's were computed from its own predicted features, and are re-read from the
target's true ones; a block drafter never keeps its block). ``reads_last_draft``: whether d_γ is read in its
own round (a draft with linear-attention layers: a hole would advance its recurrent state) rather than next
round, only if accepted. ``max_depth``: the deepest round it drafts (a block drafter: its block).

Porting a drafter onto it: keep the model-specific forward (what a slot is made of) in the methods above,
and let this class run the round, the rollback and the rows; ``root`` is set here after every verification.
The loop's contract is :class:`~hf_specmm.drafter.Drafter`'s.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, Callable

import torch

from .. import _compat
from ..budget import RoundBudget
from ..drafter import Drafter, Proposal, RoundStart
from ..targets.positions import ROPE_1D, PositionRule
from ..trees import LevelAncestry, TreeShape, expand_tree
from ..vocab import VocabMap

if TYPE_CHECKING:
    from ..selector import Selector

#: reads one tree level: ``(tokens [A, K], parents [A, K], depth) -> logits [A, K, V]`` (target vocabulary), the
#: nodes ``tokens`` at ``depth`` (1: the root's children), each the child of ``parents`` among the level before
LevelReader = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


class CachedDrafter(Drafter):
    """Base of the drafters that draft from a cache (see the module doc): the round (chain or tree), the
    rollback, the pending slots, the root and the rows. ``state``: the drafter's own cache (``length``,
    ``reserve``, ``rollback``, ``select_rows``), or None where its context is the target's cache."""

    keeps_read_drafts: bool = True
    drafts_trees = True
    follows_plain_steps = True
    selects_rows = True
    #: the deepest chain or tree a round drafts (None: as deep as the budget asks)
    max_depth: int | None = None

    def __init__(self, draft: Any, vocab: VocabMap, model: Any = None, positions: PositionRule = ROPE_1D):
        super().__init__(draft, vocab, model, positions)
        self.state: Any = None
        #: the slots to read first next round: per-row tensors [A, k, ...], ``valid`` [A, k] last
        self.pending: tuple[torch.Tensor, ...] | None = None
        self.root: torch.Tensor | None = None  # [A] the target's newest token: the next tree's root

    # ---- what a subclass reads -------------------------------------------------------------------------
    @abstractmethod
    def read_pending(self) -> torch.Tensor:
        """Feed the pending slots (one forward); the target-vocabulary logits [A, V] after the last."""

    @abstractmethod
    def read_draft(self, token: torch.Tensor) -> torch.Tensor:
        """Feed the drafted token [A]; the logits [A, V] of the next."""

    def read_level(self, tokens: torch.Tensor, parents: torch.Tensor, attention_mask: Any,
                   position_ids: torch.Tensor) -> torch.Tensor:
        """Append a tree level of K slots (``tokens`` [A, K], each the child of ``parents`` [A, K] among the previous
        level's slots, -1: the root) with ``attention_mask`` in place of the cache's 2-D one and ``position_ids``;
        their logits [A, K, V] (target vocabulary, loop device). Read by the default :meth:`tree_levels`."""
        raise NotImplementedError(f"{type(self).__name__} reads tree levels through its own tree_levels")

    @abstractmethod
    def queue(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor, path: torch.Tensor | None,
              unread: torch.Tensor) -> None:
        """After the rollback: set :attr:`pending` for the next round (:attr:`root` is ``next_tokens`` already).
        ``unread`` [A] bool: rows whose last kept draft was kept without being read (only with
        :attr:`keeps_read_drafts`): read it first."""

    def prepare_round(self, gamma: int) -> None:
        """Before a chain round's first forward (a compiled drafter pads ``pending`` to one width)."""

    @property
    def reads_last_draft(self) -> bool:
        return False

    # ---- the round -------------------------------------------------------------------------------------
    def pending_width(self) -> int:
        assert self.pending is not None
        return self.pending[-1].shape[1]

    def begin_round(self, gamma: int | None) -> RoundStart | None:
        """Where the round begins, for :meth:`accept`'s rollback (None: no state of its own to roll back). A
        chain of ``gamma`` reserves its room first (a tree: None), so that slot indices stay put."""
        if self.state is None:
            return None
        if gamma is not None:
            self.prepare_round(gamma)
            self.state.reserve(self.pending_width() + gamma)
        return RoundStart(self.state.length, self.pending_width())

    def propose(self, budget: RoundBudget, select: "Selector") -> Proposal:
        assert self.pending is not None and budget.gamma >= 1
        if budget.tree is not None:
            return self.propose_tree(budget.tree, select)
        gamma = budget.gamma if self.max_depth is None else min(budget.gamma, self.max_depth)
        start = self.begin_round(gamma)
        logits = self.read_pending()
        tokens, probs = [], []
        for j in range(gamma):
            token, prob = select(logits, j)
            tokens.append(token)
            probs.append(prob)
            if select.stop:  # every row is below the confidence threshold: end the round
                if self.reads_last_draft:
                    self.read_draft(token)
                break
            # d_γ is read next round, only if accepted (or now, see reads_last_draft)
            if j + 1 < gamma or self.reads_last_draft:
                logits = self.read_draft(token)
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs[0] is not None else None, start)

    def propose_tree(self, shape: TreeShape, select: "Selector") -> Proposal:
        """Read the pending slots, then :func:`~hf_specmm.trees.expand_tree`, one :meth:`tree_levels` read per
        level; history-reading processors see each node's own root path."""
        assert self.root is not None
        if self.max_depth is not None:
            shape = shape.cut(min(shape.depth, self.max_depth))
        start = self.begin_round(None)
        root_logits = self.read_pending()
        read = self.tree_levels(shape)
        level_paths: list[torch.Tensor] = []  # the previous level's nodes' root paths [A, K, depth - 1]

        def step(tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            paths = extend_paths(level_paths, tokens, parents)
            depth = paths.shape[-1]
            return select.level_scores(read(tokens, parents, depth), depth, paths)

        root = select.level_scores(root_logits[:, None], 0)[:, 0]
        tree = expand_tree(self.root, root, step, shape)
        return Proposal(tree.tokens[:, 1:], None, start, tree=tree, depth=shape.depth)

    def tree_levels(self, shape: TreeShape) -> LevelReader:
        """After the pending read: a :data:`LevelReader` appending each level's K frontier nodes to ``state`` in
        ONE :meth:`read_level` forward, at the position their depth gives (the position rule's chain positions,
        M-RoPE included), attending through :class:`~hf_specmm.trees.LevelAncestry`'s 4-D mask (the prefix as it
        was after the pending slots, plus each node's own root path)."""
        state = self.state
        prefix = state.length if state.mask is None else state.mask.clone()  # the root is its last valid slot
        chain = state.positions.block_positions(state.next_positions(), None, shape.depth)
        dtype = self.model.dtype if self.model.dtype.is_floating_point else torch.float32
        config = self.model.config
        ancestry = LevelAncestry()

        def read(tokens: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
            ancestry.add(parents)
            mask = _compat.mask_argument(config, lambda w: ancestry.attention_mask(prefix, dtype, w))
            positions = chain[..., depth - 1 : depth].expand(*chain.shape[:-1], tokens.shape[1])
            return self.read_level(tokens, parents, mask, positions)

        return read

    def accept(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor,
               path: torch.Tensor | None = None) -> None:
        """Roll ``state`` back to the round's start plus the kept drafts it read (a tree's gathered into place),
        then :meth:`queue` the next round's slots after ``next_tokens``, the new root."""
        unread = torch.zeros_like(keep, dtype=torch.bool)
        start = proposal.start
        if start is not None:
            read, order = torch.zeros_like(keep), None
            if self.keeps_read_drafts:
                read, order = self._read_on_path(proposal, keep, path)
                unread = read < keep
            self.state.rollback(start.length, start.pending + read, order)
        self.root = next_tokens
        self.queue(proposal, keep, next_tokens, path, unread)

    def _read_on_path(self, proposal: Proposal, keep: torch.Tensor,
                      path: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[A] kept drafts the drafter read, and (a tree) the order of the slots to keep: the pending ones, then
        the fed-slot index of each kept path node. Only a path's last node can be unread (a node the draft read
        is a frontier node, whose parent was one too)."""
        if proposal.tree is None:  # a chain read d_1..d_{γ-1} (every one where it reads the last draft too)
            return keep.clamp_max(proposal.gamma if self.reads_last_draft else proposal.gamma - 1), None
        slots = proposal.tree.draft_slots.gather(1, path[:, 1:].to(proposal.tree.draft_slots.device))
        on_path = torch.arange(slots.shape[1], device=keep.device)[None] < keep[:, None]
        read = ((slots >= 0) & on_path).sum(-1)
        width = proposal.start.pending
        pending = torch.arange(width, device=keep.device).expand(keep.shape[0], width)
        return read, torch.cat([pending, width + slots.clamp_min(0)], 1)

    def select_rows(self, keep: torch.Tensor) -> None:
        assert self.pending is not None and self.root is not None
        super().select_rows(keep)
        if self.state is not None:
            self.state.select_rows(keep)
        self.pending = tuple(t[keep.to(t.device)] for t in self.pending)
        self.root = self.root[keep.to(self.root.device)]


def extend_paths(level_paths: list[torch.Tensor], tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """The root paths [A, K, depth] of a new tree level's nodes ``tokens`` [A, K]: each its parent's (``parents``
    [A, K] among the previous level, whose paths ``level_paths`` holds), then its own token. Replaces the
    previous level's paths in ``level_paths`` (history-reading processors see a node's own path)."""
    paths = tokens[..., None]
    if level_paths:
        before = level_paths.pop()
        index = parents.clamp_min(0)[..., None].expand(-1, -1, before.shape[-1])
        paths = torch.cat([before.gather(1, index), paths], dim=-1)
    level_paths.append(paths)
    return paths
