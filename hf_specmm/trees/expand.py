"""EAGLE-2 dynamic draft trees (Li et al. 2406.16858): expand by the draft's cumulative confidence, then rerank.

Expansion: the root's top-K tokens are level 1. At each further level the K frontier nodes (the previous
level's K best by cumulative draft log-probability) are read by the draft in ONE batched forward
(``step``), each proposes its top-K children, and the K best of those K² become the next frontier. After
depth D, the N best of all K + (D-1)·K² candidates (by cumulative score) are kept. A child's cumulative score
never exceeds its parent's and ties go to the earlier candidate, so every kept node's parent is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from .tree import DraftTree

#: ``step(tokens [B, K], parents [B, K]) -> logits [B, K, V]``: the draft reads one level's K nodes and returns
#: each one's next-token logits (target vocabulary). ``parents``: each node's parent among the K nodes of the
#: previous call (-1 at the first call: their parent is the root, which the draft had already read).
StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TreeShape:
    """A tree round's static shape: ``top_k`` children per expanded node and frontier nodes per level,
    ``depth`` levels, ``nodes`` draft nodes kept (N, a count: the root is not one). Checked on construction.

        >>> TreeShape(top_k=4, depth=5, nodes=24).candidates
        68
    """

    top_k: int
    depth: int
    nodes: int

    def __post_init__(self) -> None:
        for name in ("top_k", "depth", "nodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Tree {name} must be an integer >= 1, got {value!r}")
        if self.nodes > self.candidates:
            raise ValueError(
                f"Tree nodes={self.nodes} exceeds the {self.candidates} candidates a top_k={self.top_k}, "
                f"depth={self.depth} expansion produces (top_k + (depth - 1) * top_k**2): lower nodes or raise "
                "top_k / depth")

    @property
    def candidates(self) -> int:
        return self.top_k + (self.depth - 1) * self.top_k ** 2

    def cut(self, depth: int) -> "TreeShape":
        """The shape ``depth`` levels deep, with no more nodes than those levels can hold (near ``max_length``,
        a block drafter's block).

            >>> TreeShape(top_k=2, depth=4, nodes=12).cut(2)
            TreeShape(top_k=2, depth=2, nodes=6)
        """
        shallow = replace(self, depth=depth, nodes=1)
        return replace(shallow, nodes=min(self.nodes, shallow.candidates))


def top_k_first_index(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk`` along the last dim with ties broken toward the lower index (as ``argmax``): sorted by
    value descending, then index ascending. Returns (values, indices), each [..., k]."""
    if values.shape[-1] < k:
        raise ValueError(f"cannot take the top {k} of {values.shape[-1]} entries")
    kth = values.topk(k, dim=-1).values[..., -1:]
    above, tied = values > kth, values == kth
    room = k - above.sum(-1, keepdim=True)
    chosen = above | (tied & (tied.cumsum(-1) <= room))  # exactly k per row: the lowest-index ties
    width = values.shape[-1]
    descending_index = torch.arange(width, 0, -1, device=values.device)
    index = (chosen * descending_index).topk(k, dim=-1).indices  # the k chosen, lowest index first
    picked = values.gather(-1, index)
    order = torch.sort(picked, dim=-1, descending=True, stable=True).indices
    return picked.gather(-1, order), index.gather(-1, order)


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    # log_softmax is <= 0 (up to rounding, clamped): a child never outscores its parent
    return torch.log_softmax(logits.float(), dim=-1).clamp_max(0.0)


def expand_tree(root_tokens: torch.Tensor, root_logits: torch.Tensor, step: StepFn, shape: TreeShape) -> DraftTree:
    """EAGLE-2 expansion. ``root_tokens`` [B]: each row's last accepted token; ``root_logits`` [B, V]: the
    draft's logits after reading it (target vocabulary; -inf where a token may not be proposed). ``step`` reads each level (see :data:`StepFn`):
    ``shape.depth - 1`` calls. Returns a :class:`DraftTree` of ``shape.nodes`` nodes per row, in candidate
    order (parents first, each node's children by decreasing draft probability); nodes of draft probability 0
    are invalid, and
    ``draft_slots`` says which of the ``step`` calls' fed slots read each node ((call - 1) * K + k).

    With ``top_k=1, depth=tokens=γ`` the tree is the greedy chain a chain drafter proposes.

        >>> logits = torch.tensor([[0.0, 3.0, 1.0]])
        >>> tree = expand_tree(torch.tensor([7]), logits, lambda t, p: logits[:, None].expand(-1, t.shape[1], -1),
        ...                    TreeShape(top_k=2, depth=2, nodes=3))
        >>> tree.tokens.tolist(), tree.parents.tolist()
        ([[7, 1, 2, 1]], [[-1, 0, 0, 1]])
    """
    k, depth = shape.top_k, shape.depth
    batch, device = root_logits.shape[0], root_logits.device
    scores, tokens = top_k_first_index(_log_probs(root_logits), k)  # level 1: [B, K]
    rows = torch.arange(batch, device=device)[:, None]
    level = torch.arange(k, device=device).expand(batch, k)  # level 1's candidates: 1..K
    all_tokens, all_parents, all_scores = [tokens], [torch.zeros_like(tokens)], [scores]
    all_slots = [level.clone() if depth > 1 else torch.full_like(level, -1)]  # step call 1 reads all of level 1
    frontier = (level + 1, tokens, scores, torch.full_like(tokens, -1))  # candidate ids, tokens, scores, parents
    first = 1 + k  # candidate id of the next level's first candidate
    for call in range(1, depth):
        ids, frontier_tokens, frontier_scores, frontier_parents = frontier
        logits = step(frontier_tokens, frontier_parents)  # [B, K, V]
        child_scores, child_tokens = top_k_first_index(_log_probs(logits), k)
        cumulative = (frontier_scores[:, :, None] + child_scores).reshape(batch, k * k)  # candidates, parent-major
        child_tokens = child_tokens.reshape(batch, k * k)
        all_tokens.append(child_tokens)
        all_parents.append(ids.repeat_interleave(k, dim=1))
        all_scores.append(cumulative)
        # the next frontier: the level's K best (ties: the earlier candidate)
        order = torch.sort(cumulative, dim=1, descending=True, stable=True).indices[:, :k]
        slots = torch.full((batch, k * k), -1, dtype=torch.long, device=device)
        if call + 1 < depth:  # read by the next call, as its slots call * K + 0..K-1
            slots[rows, order] = call * k + torch.arange(k, device=device)
        all_slots.append(slots)
        frontier = (first + order, child_tokens.gather(1, order), cumulative.gather(1, order), order // k)
        first += k * k
    return _keep_best(root_tokens, torch.cat(all_tokens, 1), torch.cat(all_parents, 1), torch.cat(all_scores, 1),
                      torch.cat(all_slots, 1), shape.nodes)


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


def _keep_best(root_tokens: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, slots: torch.Tensor,
               keep: int) -> DraftTree:
    """The ``keep`` best candidates (ids 1..C; parents are candidate ids, 0 = root) as a tree in candidate order."""
    batch = tokens.shape[0]
    device = tokens.device
    best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :keep]
    chosen = torch.sort(best, dim=1).values  # candidate order: every parent before its children
    # candidate id -> node index (root 0 -> 0); parents are always kept, so every lookup lands on a kept node
    node_of = torch.zeros(batch, tokens.shape[1] + 1, dtype=torch.long, device=device)
    node_of.scatter_(1, chosen + 1, torch.arange(1, keep + 1, device=device).expand(batch, keep))
    node_parents = node_of.gather(1, parents.gather(1, chosen))
    root = torch.zeros(batch, 1, dtype=torch.long, device=device)
    node_scores = scores.gather(1, chosen)
    return DraftTree.from_parents(
        torch.cat([root_tokens[:, None].to(tokens), tokens.gather(1, chosen)], 1), torch.cat([root - 1, node_parents], 1),
        valid=torch.cat([root == 0, torch.isfinite(node_scores)], 1),
        scores=torch.cat([root.float(), node_scores], 1),
        draft_slots=torch.cat([root - 1, slots.gather(1, chosen)], 1))
