"""``CachedDrafter``: the base of every drafter that keeps a KV cache of its own and reads one slot per token.

A KV-cached drafter owns a :class:`~hf_specmm.caches.SlottedCache` (``state``) and the slots it has not read
yet (``pending``: the target's tokens since its last round, and whatever else each slot carries). Every
round has the same life, written once here::

    propose(budget, select)
        start = RoundStart(state.length, pending width)     # where accept() rolls back to
        root logits = read_pending()                        # ONE forward over the pending slots
        chain:  d_j = select(logits, j); logits = read_draft(d_j)     (γ - 1 forwards; d_γ is read next round)
        tree:   expand_tree(root, root logits, step)        # step = read_level: ONE forward per level
    accept(proposal, keep, next_tokens, path)
        state.rollback(start, pending + the kept drafts it read, in path order)
        queue(...)                                          # the next round's pending slots
    follow(next_tokens)                                     # a plain target step: queue, read next round
    select_rows(keep)                                       # finished rows leave: state, pending, root

A subclass supplies only what it reads:

- :meth:`read_pending` (the pending slots → the root's logits [A, V]) and :meth:`read_draft` (one drafted token
  → the next logits [A, V]); :meth:`read_level` (a tree level of K nodes in one forward with the 4-D mask and
  positions it is given → logits [A, K, V]);
- :meth:`queue`: after the rollback, the next round's ``pending`` (an LM queues ``next_tokens``; a feature head
  the verification's true features of every kept token);
- :meth:`follow`, and :meth:`prefill` (build ``state`` with the cache factory, read the prompt, set ``pending``
  and ``root``).

``pending`` is a tuple of per-row tensors, each [A, k, ...] with the slots along dimension 1 and ``valid``
[A, k] bool last (left-padded rows hold masked holes); :meth:`select_rows` selects every one of them.
``keeps_read_drafts``: whether the drafts it read stay in its cache when accepted (an LM's do: they are what it
would read again; a feature head's were computed from its own predicted features, and are re-read from the
target's true ones). ``reads_last_draft``: whether d_γ is read in its own round (a draft with linear-attention
layers: a hole would advance its recurrent state) rather than next round, only if accepted.

Porting a drafter onto it: keep the model-specific forward (what a slot is made of) in the four methods above,
set ``root`` wherever the target's newest token becomes known (prefill, queue, follow), and let this class run
the round, the rollback and the rows. The loop's contract is :class:`~hf_specmm.drafter.Drafter`'s.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from .. import _compat
from ..budget import RoundBudget
from ..caches import SlottedCache
from ..drafter import Drafter, Proposal, RoundStart
from ..targets.positions import ROPE_1D, PositionRule
from ..trees import LevelAncestry, expand_tree
from ..vocab import VocabMap

if TYPE_CHECKING:
    from ..selector import Selector


class CachedDrafter(Drafter):
    """Base of the KV-cached drafters (an LM's :class:`~hf_specmm.drafts.chain.LMDrafter`, the feature head's):
    the round (chain or tree), the rollback, the pending slots and the rows (see the module doc)."""

    keeps_read_drafts: bool = True
    drafts_trees = True
    follows_plain_steps = True
    selects_rows = True

    def __init__(self, draft: Any, vocab: VocabMap, model: Any = None, positions: PositionRule = ROPE_1D):
        super().__init__(draft, vocab, model, positions)
        self.state: SlottedCache | None = None
        #: the slots to read first next round: per-row tensors [A, k, ...], ``valid`` [A, k] last
        self.pending: tuple[torch.Tensor, ...] | None = None
        self.root: torch.Tensor | None = None  # [A] the target's newest token: the next tree's root

    # ---- what a subclass reads -------------------------------------------------------------------------
    @abstractmethod
    def read_pending(self) -> torch.Tensor:
        """Feed the pending slots (one forward); the target-vocabulary logits [A, V] after the last."""

    @abstractmethod
    def read_draft(self, token: torch.Tensor) -> torch.Tensor:
        """Feed the drafted token [A] (one forward); the logits [A, V] of the next."""

    @abstractmethod
    def read_level(self, tokens: torch.Tensor, parents: torch.Tensor, attention_mask: Any,
                   position_ids: torch.Tensor) -> torch.Tensor:
        """Append a tree level of K slots (``tokens`` [A, K], each the child of ``parents`` [A, K] among the previous
        level's slots, -1: the root) with ``attention_mask`` in place of the cache's 2-D one and ``position_ids``;
        their logits [A, K, V] (target vocabulary, loop device)."""

    @abstractmethod
    def queue(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor, path: torch.Tensor | None,
              unread: torch.Tensor) -> None:
        """After the rollback: set :attr:`pending` for the next round. ``unread`` [A] bool: rows whose last kept
        draft was kept without being read (only with :attr:`keeps_read_drafts`): read it first."""

    def prepare_round(self, gamma: int) -> None:
        """Before a chain round's first forward (a compiled drafter pads ``pending`` to one width)."""

    @property
    def reads_last_draft(self) -> bool:
        return False

    # ---- the round -------------------------------------------------------------------------------------
    def pending_width(self) -> int:
        assert self.pending is not None
        return self.pending[-1].shape[1]

    def propose(self, budget: RoundBudget, select: "Selector") -> Proposal:
        assert self.pending is not None and self.state is not None and budget.gamma >= 1
        if budget.tree is not None:
            return self.propose_tree(budget, select)
        self.prepare_round(budget.gamma)
        self.state.reserve(self.pending_width() + budget.gamma)  # room for the round: slot indices stay put
        start = RoundStart(self.state.length, self.pending_width())
        logits = self.read_pending()
        tokens, probs = [], []
        for j in range(budget.gamma):
            token, prob = select(logits, j)
            tokens.append(token)
            probs.append(prob)
            if select.stop:  # every row is below the confidence threshold: end the round
                if self.reads_last_draft:
                    self.read_draft(token)
                break
            # d_γ is read next round, only if accepted (or now, see reads_last_draft)
            if j + 1 < budget.gamma or self.reads_last_draft:
                logits = self.read_draft(token)
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs[0] is not None else None, start)

    def propose_tree(self, budget: RoundBudget, select: "Selector") -> Proposal:
        """Read the pending slots, then :func:`~hf_specmm.trees.expand_tree` with ONE forward per level: the
        level's K frontier nodes are appended at the position their depth gives (the position rule's chain
        positions, M-RoPE included) and attend through :class:`~hf_specmm.trees.LevelAncestry`'s 4-D mask (the
        prefix as it was after the pending slots, plus each node's own root path)."""
        assert budget.tree is not None and self.state is not None and self.root is not None
        start = RoundStart(self.state.length, self.pending_width())
        root_logits = self.read_pending()
        state = self.state
        prefix = state.length if state.mask is None else state.mask.clone()  # the root is its last valid slot
        chain = state.positions.block_positions(state.next_positions(), None, budget.tree.depth)
        dtype = self.model.dtype if self.model.dtype.is_floating_point else torch.float32
        config = self.model.config
        ancestry = LevelAncestry()
        level_paths: list[torch.Tensor] = []  # the previous level's nodes' root paths [A, K, depth - 1]

        def step(tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            ancestry.add(parents)
            depth = int(ancestry.depths[0, -1])
            mask = _compat.mask_argument(config, lambda w: ancestry.attention_mask(prefix, dtype, w))
            positions = chain[..., depth - 1 : depth].expand(*chain.shape[:-1], tokens.shape[1])
            paths = extend_paths(level_paths, tokens, parents)
            return select.level_scores(self.read_level(tokens, parents, mask, positions), depth, paths)

        root = select.level_scores(root_logits[:, None], 0)[:, 0]
        tree = expand_tree(self.root, root, step, budget.tree)
        return Proposal(tree.tokens[:, 1:], None, start, tree=tree, depth=budget.tree.depth)

    def accept(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor,
               path: torch.Tensor | None = None) -> None:
        """Roll the cache back to the round's start plus the kept drafts it read (a tree's gathered into place),
        then :meth:`queue` the next round's slots."""
        assert self.state is not None and proposal.start is not None
        start = proposal.start
        read, order = torch.zeros_like(keep), None
        if self.keeps_read_drafts:
            read, order = self._read_on_path(proposal, keep, path)
        self.state.rollback(start.length, start.pending + read, order)
        self.root = next_tokens
        self.queue(proposal, keep, next_tokens, path, read < keep)

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
        assert self.state is not None and self.pending is not None and self.root is not None
        super().select_rows(keep)
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
