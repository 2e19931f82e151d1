"""What one round verifies: the verification block.

A block is the tokens the target scores in one forward, plus their shape. :class:`Block` is the protocol the
loop reads; its two shapes are siblings: a :class:`ChainBlock` ``[cur, d_1..d_γ]`` (each token attends to the
ones before it) and a :class:`TreeBlock` (each node attends to its root path, ``hf_specmm.Tree``). A block
writes itself into a cache (:meth:`Block.append_to`: its validity, attention mask and positions through the
cache's position rule) and verifies itself with its shape's rule, greedy or sampling (plain functions:
:mod:`hf_specmm.verifier` for a chain, :mod:`hf_specmm.trees` for a tree). What a rule keeps of it is an
:class:`~hf_specmm.trees.Acceptance`. :func:`block_of` is the one place a round's shape is read off its proposal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from . import _compat, verifier
from .caches import SlottedCache
from .drafter import Proposal
from .history import RowHistory, apply_processors, apply_processors_along_paths
from .trees import Acceptance, DraftTree, greedy_verify_tree, sample_verify_tree


class Block(Protocol):
    """What the loop does with a round's block, in order: ``append_to`` the target's cache, run the target on
    ``tokens`` (``width`` positions), ``scores`` its logits, ``verify`` them, read ``along_path`` what the rows
    kept, count what was ``drafted``."""

    tokens: torch.Tensor  # [A, width] the target ids the verification forward reads
    #: whether the block is a draft tree (the statistics count a tree's drafted nodes otherwise)
    is_tree: bool

    @property
    def width(self) -> int: ...

    def append_to(self, cache: SlottedCache) -> dict[str, torch.Tensor | None]:
        """Record the block in ``cache``; the attention mask and position ids of the forward that writes it."""
        ...

    def scores(self, processors: Any, history: RowHistory, logits: torch.Tensor,
               rows: torch.Tensor | None) -> torch.Tensor:
        """The target's processed scores [A, width, V] at every block position."""
        ...

    def verify(self, proposal: Proposal, scores: torch.Tensor, lengths: torch.Tensor | None,
               sample: bool) -> Acceptance:
        """What this shape's rule keeps of the block, from the target's processed ``scores`` [A, width, V]: greedy,
        or lossless sampling where ``sample`` (``lengths`` [A]: drafts per row)."""
        ...

    def drafted(self, proposal: Proposal, lengths: torch.Tensor | None, room: list[int] | None = None) -> torch.Tensor:
        """[A] drafts each row proposed that it could have kept (``room``: tokens it may still add, less one)."""
        ...

    def along_path(self, x: torch.Tensor, accepted: Acceptance) -> torch.Tensor:
        """``x`` [A, width, ...] per block position at the positions the rows keep, in order."""
        ...


@dataclass
class ChainBlock:
    """``tokens`` [A, γ + 1]: the row's current token, then its drafts d_1..d_γ."""

    tokens: torch.Tensor
    is_tree = False

    @classmethod
    def of(cls, cur: torch.Tensor, proposal: Proposal) -> "ChainBlock":
        return cls(torch.cat([cur[:, None], proposal.tokens], dim=1))

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def append_to(self, cache: SlottedCache) -> dict[str, torch.Tensor | None]:
        return cache.append(None, self.width)

    def scores(self, processors: Any, history: RowHistory, logits: torch.Tensor,
               rows: torch.Tensor | None) -> torch.Tensor:
        """p_0..p_γ: position j's logits processed with the row's history plus d_1..d_j."""
        return apply_processors(processors, history, logits, rows=rows)

    def verify(self, proposal: Proposal, scores: torch.Tensor, lengths: torch.Tensor | None,
               sample: bool) -> Acceptance:
        """The longest prefix the target's argmax agrees with, or rejection sampling against the drafts' q."""
        if sample:
            return Acceptance(*verifier.rejection_sample(proposal.tokens, proposal.probs, scores.softmax(-1),
                                                         lengths=lengths))
        return Acceptance(*verifier.greedy_verify(proposal.tokens, scores, lengths=lengths))

    def drafted(self, proposal: Proposal, lengths: torch.Tensor | None, room: list[int] | None = None) -> torch.Tensor:
        """A chain: all γ (or the row's confidence-threshold length; the statistics cap them at ``room``)."""
        if lengths is not None:
            return lengths
        return torch.full((self.tokens.shape[0],), proposal.gamma, dtype=torch.long, device=self.tokens.device)

    def along_path(self, x: torch.Tensor, accepted: Acceptance) -> torch.Tensor:
        return x  # a chain keeps a prefix of its positions, in order


@dataclass
class TreeBlock:
    """A draft tree's N + 1 nodes (node 0: the row's current token, the root the drafter expanded), each
    attending to its root path, at the position a chain token of its depth would have (``hf_specmm.trees``).
    ``config`` / ``dtype``: the target's (per-layer-type masks for Gemma 3, the additive mask's dtype)."""

    tree: DraftTree
    config: Any = None
    dtype: torch.dtype = torch.float32
    is_tree = True

    @classmethod
    def of(cls, proposal: Proposal, target: Any) -> "TreeBlock":
        dtype = target.dtype if target.dtype.is_floating_point else torch.float32
        return cls(proposal.tree, target.config, dtype)

    @property
    def tokens(self) -> torch.Tensor:
        return self.tree.tokens

    @property
    def width(self) -> int:
        return self.tree.tokens.shape[1]

    def append_to(self, cache: SlottedCache) -> dict[str, torch.Tensor | None]:
        """The tree's 4-D mask (through ``_compat.mask_argument``) and depth positions (the cache's position rule:
        1-D or M-RoPE); invalid nodes are recorded as holes."""
        prefix = cache.length if cache.mask is None else cache.mask.clone()
        chain = cache.positions.block_positions(cache.next_positions(), None, self.tree.max_depth + 1)
        inputs = cache.append(self.tree.valid, self.width, self.tree.positions(chain))
        inputs["attention_mask"] = _compat.mask_argument(
            self.config, lambda window: self.tree.attention_mask(prefix, self.dtype, window))
        return inputs

    def scores(self, processors: Any, history: RowHistory, logits: torch.Tensor,
               rows: torch.Tensor | None) -> torch.Tensor:
        """Each node's logits processed with the row's history plus the node's own root path."""
        return apply_processors_along_paths(processors, history, logits, self.tree.root_paths(), self.tree.depths,
                                            rows=rows)

    def verify(self, proposal: Proposal, scores: torch.Tensor, lengths: torch.Tensor | None,
               sample: bool) -> Acceptance:
        """The deepest root path the target's argmax agrees with, or multi-candidate sampling (needs no q)."""
        return sample_verify_tree(self.tree, scores.softmax(-1)) if sample else greedy_verify_tree(self.tree, scores)

    def drafted(self, proposal: Proposal, lengths: torch.Tensor | None, room: list[int] | None = None) -> torch.Tensor:
        """[A] valid nodes of each row no deeper than its ``room`` [A] (the tokens it may still add, less the
        target's own): the tree is cut to the roomiest row's depth, so a row with less room has deeper nodes
        it could never keep."""
        valid = self.tree.valid[:, 1:]
        if room is not None:
            valid = valid & (self.tree.depths[:, 1:] <= torch.tensor(room, device=valid.device)[:, None])
        return valid.sum(-1)

    def along_path(self, x: torch.Tensor, accepted: Acceptance) -> torch.Tensor:
        index = accepted.path.to(x.device).view(*accepted.path.shape, *([1] * (x.dim() - 2)))
        return x.gather(1, index.expand(-1, -1, *x.shape[2:]))


def block_of(cur: torch.Tensor, proposal: Proposal, target: Any) -> Block:
    """The block a round verifies: the proposal's draft tree (rooted at ``cur``), else the chain ``[cur, d_1..d_γ]``."""
    if proposal.tree is not None:
        return TreeBlock.of(proposal, target)
    return ChainBlock.of(cur, proposal)
