"""Tree drafting for KV-cached drafters (:class:`~hf_specmm.drafts.chain.ChainDrafter`, the feature head).

One round: read the pending tokens (one forward, as the chain does), then :func:`expand_tree` with ONE draft
forward per level: the level's K frontier nodes are appended to the drafter's own
:class:`~hf_specmm.caches.SlottedCache` at the position their depth gives (the position rule's chain
positions, M-RoPE included) and attend through :class:`LevelAncestry`'s 4-D mask (the prefix as it was after
the pending tokens, plus each node's own root path). After verification the slots of the accepted path's
nodes the draft read are gathered into place (``SlottedCache.rollback`` with a path); the rest is queued as
the chain queues it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .. import _compat
from ..budget import RoundBudget
from ..drafter import Proposal
from ..trees import LevelAncestry, expand_tree

if TYPE_CHECKING:
    from ..selector import DraftSelector


class TreeDrafting:
    """Mixin: :meth:`propose_tree` for a drafter with ``state`` (its SlottedCache) and ``model`` that
    implements :meth:`_read_pending` (the round's first forward: root logits [A, V]) and :meth:`_read_level`
    (K nodes in one forward: logits [A, K, V])."""

    state: Any
    model: Any

    def _read_pending(self) -> tuple[torch.Tensor, tuple[int, int]]:
        """Read the pending tokens; returns the root's logits [A, V] and ``restore`` (cache length at round
        start, pending width)."""
        raise NotImplementedError

    def _read_level(self, tokens: torch.Tensor, parents: torch.Tensor, attention_mask: Any,
                    position_ids: torch.Tensor) -> torch.Tensor:
        """Append K slots (``SlottedCache.append`` with ``position_ids``; ``attention_mask`` replaces the 2-D mask
        it returns) (``tokens`` [A, K], each the child of ``parents`` [A, K] among the previous level's
        slots, -1: the root) and return their logits [A, K, V] (target vocabulary, loop device)."""
        raise NotImplementedError

    def propose_tree(self, budget: RoundBudget, select: "DraftSelector") -> Proposal:
        assert budget.tree is not None
        root_logits, restore = self._read_pending()
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
            mask = _compat.tree_attention_argument(config, lambda w: ancestry.attention_mask(prefix, dtype, w))
            positions = chain[..., depth - 1 : depth].expand(*chain.shape[:-1], tokens.shape[1])
            paths = tokens[..., None]
            if level_paths:  # a node's path: its parent's, then its own token
                before = level_paths.pop()
                index = parents.clamp_min(0)[..., None].expand(-1, -1, before.shape[-1])
                paths = torch.cat([before.gather(1, index), paths], dim=-1)
            level_paths.append(paths)
            return select.level_scores(self._read_level(tokens, parents, mask, positions), depth, paths)

        root = select.level_scores(root_logits[:, None], 0)[:, 0]
        cur = torch.zeros(root.shape[0], dtype=torch.long, device=root.device)  # the loop puts its own root
        tree = expand_tree(cur, root, step, budget.tree)
        return Proposal(tree.tokens[:, 1:], None, restore, tree=tree, depth=budget.tree.depth)

    def _kept_draft_slots(self, proposal: Proposal, n: torch.Tensor, path: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The accepted path nodes the draft read: ``(read [A], slots [A, D])`` with ``slots[b, j]`` the fed-slot
        index of path node j + 1 (valid for j < read[b]). Only a path's last node can be unread (a node the
        draft read is a frontier node, whose parent was one too)."""
        slots = proposal.tree.draft_slots.gather(1, path[:, 1:].to(proposal.tree.draft_slots.device))
        on_path = torch.arange(slots.shape[1], device=n.device)[None] < n[:, None]
        read = ((slots >= 0) & on_path).sum(-1)
        return read, slots.clamp_min(0)

    def accept_tree(self, proposal: Proposal, n: torch.Tensor, next_tokens: torch.Tensor,
                    path: torch.Tensor) -> torch.Tensor:
        """Keep the pending slots and the accepted nodes the draft read (gathered into place); returns [A] bool:
        rows whose last accepted node was not read (to be read first next round, as the chain's d_γ)."""
        start, width = proposal.restore
        read, slots = self._kept_draft_slots(proposal, n, path)
        pending = torch.arange(width, device=n.device).expand(n.shape[0], width)
        self.state.rollback(start, width + read, torch.cat([pending, width + slots], 1))
        return read < n
