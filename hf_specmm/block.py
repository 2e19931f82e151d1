"""What one round verifies: the verification block.

A block is the tokens the target scores in one forward, plus their shape: a *chain* ``[cur, d_1..d_γ]``
today (each token attends to the ones before it), a *tree* with the draft-tree wrapper (each node attends
to its ancestors). The block writes itself into a cache (:meth:`ChainBlock.append_to`): it knows its own
validity, attention mask and positions through the cache's position rule. What a verifier keeps of it is an
:class:`~hf_specmm.verify.Acceptance`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from . import _compat
from .caches import SlottedCache
from .drafter import Drafter, Proposal
from .history import RowHistory, apply_processors, apply_processors_along_paths
from .trees import DraftTree

if TYPE_CHECKING:
    from .verify import Acceptance, GreedyVerifier, SamplingVerifier


@dataclass
class ChainBlock:
    """``tokens`` [A, γ + 1]: the row's current token, then its drafts d_1..d_γ."""

    tokens: torch.Tensor

    @classmethod
    def of(cls, cur: torch.Tensor, proposal: Proposal) -> "ChainBlock":
        return cls(torch.cat([cur[:, None], proposal.tokens], dim=1))

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def append_to(self, cache: SlottedCache) -> dict[str, torch.Tensor | None]:
        """Record the block in ``cache``; the attention mask and position ids of the forward that writes it."""
        return cache.append(None, self.width)

    def scores(self, processors: Any, history: RowHistory, logits: torch.Tensor,
               rows: torch.Tensor | None) -> torch.Tensor:
        """p_0..p_γ: position j's logits processed with the row's history plus d_1..d_j."""
        return apply_processors(processors, history, logits, rows=rows)

    def verify(self, verifier: "GreedyVerifier | SamplingVerifier", proposal: Proposal, scores: torch.Tensor,
               lengths: torch.Tensor | None) -> "Acceptance":
        """What ``verifier`` keeps of the block given the target's processed ``scores`` [A, γ+1, V]."""
        return verifier(proposal.tokens, proposal.probs, scores, lengths)

    def drafted(self, proposal: Proposal, lengths: torch.Tensor | None, room: list[int] | None = None) -> torch.Tensor:
        """[A] drafts each row proposed (a chain: all; the statistics cap them at the row's ``room``)."""
        if lengths is not None:
            return lengths
        return torch.full((self.tokens.shape[0],), proposal.gamma, dtype=torch.long, device=self.tokens.device)

    def along_path(self, x: torch.Tensor, accepted: "Acceptance") -> torch.Tensor:
        """``x`` [A, width, ...] per block position at the positions the rows keep, in order (a chain: as is)."""
        return x

    def accept(self, drafter: Drafter, proposal: Proposal, m: torch.Tensor, next_tokens: torch.Tensor,
               accepted: "Acceptance") -> None:
        """Tell ``drafter`` each row kept ``m`` [A] drafts, then ``next_tokens`` [A]."""
        drafter.accept(proposal, m, next_tokens)


@dataclass
class TreeBlock(ChainBlock):
    """A draft tree's N + 1 nodes (node 0: the row's current token), each attending to its root path, at the
    position a chain token of its depth would have (``hf_specmm.trees``). ``config`` / ``dtype``: the
    target's (per-layer-type masks for Gemma 3, the additive mask's dtype)."""

    tree: DraftTree = None  # type: ignore[assignment]
    config: Any = None
    dtype: torch.dtype = torch.float32

    @classmethod
    def of_tree(cls, cur: torch.Tensor, proposal: Proposal, target: Any) -> "TreeBlock":
        tree = replace(proposal.tree, tokens=torch.cat([cur[:, None], proposal.tree.tokens[:, 1:]], dim=1))
        dtype = target.dtype if target.dtype.is_floating_point else torch.float32
        return cls(tree.tokens, tree, target.config, dtype)

    def append_to(self, cache: SlottedCache) -> dict[str, torch.Tensor | None]:
        """The tree's 4-D mask (through ``_compat.tree_attention_argument``) and depth positions (the cache's
        position rule: 1-D or M-RoPE); invalid nodes are recorded as holes."""
        prefix = cache.length if cache.mask is None else cache.mask.clone()
        chain = cache.positions.block_positions(cache.next_positions(), None, self.tree.max_depth + 1)
        inputs = cache.append(self.tree.valid, self.width, self.tree.positions(chain))
        inputs["attention_mask"] = _compat.tree_attention_argument(
            self.config, lambda window: self.tree.attention_mask(prefix, self.dtype, window))
        return inputs

    def scores(self, processors: Any, history: RowHistory, logits: torch.Tensor,
               rows: torch.Tensor | None) -> torch.Tensor:
        """Each node's logits processed with the row's history plus the node's own root path."""
        return apply_processors_along_paths(processors, history, logits, self.tree.root_paths(), self.tree.depths,
                                            rows=rows)

    def verify(self, verifier: "GreedyVerifier | SamplingVerifier", proposal: Proposal, scores: torch.Tensor,
               lengths: torch.Tensor | None) -> "Acceptance":
        return verifier.tree(self.tree, scores)

    def drafted(self, proposal: Proposal, lengths: torch.Tensor | None, room: list[int] | None = None) -> torch.Tensor:
        """[A] valid nodes of each row no deeper than its ``room`` [A] (the tokens it may still add, less the
        target's own): the tree is cut to the roomiest row's depth, so a row with less room has deeper nodes
        it could never keep."""
        valid = self.tree.valid[:, 1:]
        if room is not None:
            valid = valid & (self.tree.depths[:, 1:] <= torch.tensor(room, device=valid.device)[:, None])
        return valid.sum(-1)

    def along_path(self, x: torch.Tensor, accepted: "Acceptance") -> torch.Tensor:
        index = accepted.path.to(x.device).view(*accepted.path.shape, *([1] * (x.dim() - 2)))
        return x.gather(1, index.expand(-1, -1, *x.shape[2:]))

    def accept(self, drafter: Drafter, proposal: Proposal, m: torch.Tensor, next_tokens: torch.Tensor,
               accepted: "Acceptance") -> None:
        drafter.accept(proposal, m, next_tokens, accepted.path)


def block_of(cur: torch.Tensor, proposal: Proposal, target: Any) -> ChainBlock:
    """The block a round verifies: a tree when the drafter drafted one, else the chain ``[cur, d_1..d_γ]``."""
    if proposal.tree is not None:
        return TreeBlock.of_tree(cur, proposal, target)
    return ChainBlock.of(cur, proposal)
