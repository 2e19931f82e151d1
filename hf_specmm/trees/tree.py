"""``DraftTree``: a batch of draft trees as tensors, and the attention masks and positions that feed one.

Every row holds the same number of nodes (static shapes): node 0 is the root (the row's last accepted token,
already known to the target), nodes 1..N are drafts, in an order where every parent comes before its
children (``parents[b, i] < i``). Nodes a row cannot use are kept in place and marked invalid (``valid``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class DraftTree:
    """B rows of N + 1 nodes. ``tokens`` [B, N+1] target ids (node 0: the root); ``parents`` [B, N+1] (-1 at
    the root, else an earlier node); ``depths`` [B, N+1] (root 0); ``ancestors`` [B, N+1, N+1] bool: node i
    sees node j iff j is i or an ancestor of i; ``valid`` [B, N+1] bool (invalid nodes are never accepted and
    no valid node sees one; every invalid node's descendants are invalid); ``scores`` [B, N+1] cumulative
    draft log-probabilities (root 0); ``draft_slots`` [B, N+1]: where the draft read the node in its own
    cache during the expansion (the index among the slots its ``step`` calls fed, -1: never read).

        >>> tree = DraftTree.from_parents(torch.tensor([[5, 7, 8, 9]]), torch.tensor([[-1, 0, 0, 1]]))
        >>> tree.depths.tolist(), tree.ancestors[0, 3].tolist()
        ([[0, 1, 1, 2]], [True, True, False, True])
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    ancestors: torch.Tensor
    valid: torch.Tensor
    scores: torch.Tensor
    draft_slots: torch.Tensor

    @classmethod
    def from_parents(cls, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None,
                     scores: torch.Tensor | None = None, draft_slots: torch.Tensor | None = None) -> "DraftTree":
        """Build depths and ancestors from ``parents`` [B, N+1]; checks the layout (root first, parents before
        children) and closes ``valid`` under descent (a node below an invalid node is invalid)."""
        if tokens.dim() != 2 or parents.shape != tokens.shape:
            raise ValueError(f"tokens and parents must both be [B, N+1], got {tuple(tokens.shape)} and "
                             f"{tuple(parents.shape)}")
        batch, width = tokens.shape
        index = torch.arange(width, device=parents.device)
        if not bool((parents[:, 0] == -1).all()):
            raise ValueError("node 0 must be the root: parents[:, 0] must be -1")
        if width > 1 and not bool(((parents[:, 1:] >= 0) & (parents[:, 1:] < index[1:])).all()):
            raise ValueError("every draft node's parent must be an earlier node (0 <= parents[b, i] < i)")
        valid = torch.ones_like(tokens, dtype=torch.bool) if valid is None else valid.bool().clone()
        valid[:, 0] = True
        ancestors = _ancestor_closure(parents)
        depths = ancestors.sum(-1) - 1
        valid = ~(ancestors & ~valid[:, None, :]).any(-1)  # a node below an invalid node is invalid
        scores = torch.zeros(batch, width, device=tokens.device) if scores is None else scores
        draft_slots = torch.full_like(parents, -1) if draft_slots is None else draft_slots
        return cls(tokens, parents, depths, ancestors, valid, scores, draft_slots)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        """N: draft nodes per row (the root not counted)."""
        return self.tokens.shape[1] - 1

    @property
    def max_depth(self) -> int:
        """The deepest node of any row (a host sync)."""
        return int(self.depths.max())

    def root_paths(self) -> torch.Tensor:
        """[B, N+1, N] the tokens of each node's root path below the root, by depth (node j's first
        ``depths[b, j]`` entries; zeros after): what a node's history adds to its row's."""
        on_path = self.ancestors.clone()
        on_path[..., 0] = False  # the root is the row's current token, already in its history
        slot = (on_path.long().cumsum(-1) - 1).clamp_min(0)  # parents precede children: index order is depth order
        source = self.tokens[:, None, :].expand_as(on_path) * on_path
        paths = torch.zeros_like(source).scatter_add_(2, slot, source)
        return paths[..., : max(self.num_nodes, 1)]

    def limit_depth(self, max_depth: torch.Tensor) -> "DraftTree":
        """Mark nodes deeper than ``max_depth`` [B] invalid (a row with room for only that many new tokens)."""
        return replace(self, valid=self.valid & (self.depths <= max_depth.to(self.depths.device)[:, None]))

    def positions(self, chain_positions: torch.Tensor) -> torch.Tensor:
        """Position ids of the nodes from the position ids ``chain_positions`` [..., B, ≥ D+1] a chain of
        D+1 tokens fed at the same place would get (any position rule: 1-D [B, D+1], Qwen-VL's M-RoPE
        [4, B, D+1]): a node sits where the chain token of its depth would. Returns [..., B, N+1]."""
        index = self.depths.to(chain_positions.device).expand(*chain_positions.shape[:-1], -1)
        return chain_positions.gather(-1, index)

    def attention_mask(self, prefix: torch.Tensor | int, dtype: torch.dtype = torch.float32,
                       sliding_window: int | None = None) -> torch.Tensor:
        """The 4-D mask [B, 1, N+1, P+N+1] for feeding the N+1 nodes after ``prefix`` cache slots (see
        :func:`tree_attention_mask`): each node sees the valid prefix slots and its root path (a valid node's
        path is valid; an invalid node's output is never read)."""
        return tree_attention_mask(prefix, self.ancestors, self.depths, self.depths, dtype, sliding_window)

    def path_to(self, last: torch.Tensor) -> torch.Tensor:
        """[B, D+1] the nodes of each row's root path to node ``last`` [B], by depth (root first); entries past
        the depth of ``last`` repeat ``last`` (so gathers stay in range)."""
        depth = self.depths.shape[1] and int(self.depths.max())
        rows = torch.arange(self.batch_size, device=last.device)
        on_path = self.ancestors[rows, last]  # [B, N+1]
        slot = torch.where(on_path, self.depths, torch.full_like(self.depths, depth + 1))
        nodes = torch.arange(self.tokens.shape[1], device=last.device).expand_as(slot)
        path = torch.zeros(self.batch_size, depth + 2, dtype=torch.long, device=last.device).scatter(1, slot, nodes)
        path = path[:, : depth + 1]
        beyond = torch.arange(depth + 1, device=last.device)[None] > self.depths[rows, last][:, None]
        return torch.where(beyond, last[:, None], path)


def tree_attention_mask(prefix: torch.Tensor | int, visible: torch.Tensor, query_depths: torch.Tensor,
                        key_depths: torch.Tensor, dtype: torch.dtype = torch.float32,
                        sliding_window: int | None = None, first_depth: int = 0) -> torch.Tensor:
    """The 4-D attention mask [B, 1, Q, P+W] of Q new queries after P cached slots and W block slots.

    ``prefix``: the cache's 2-D slot mask [B, P] (0 = left padding or a hole) or, every slot valid, its
    length P. ``visible`` [B, Q, W] bool: which block slots (the last W, the queries among them) each query
    sees. ``query_depths`` [B, Q] / ``key_depths`` [B, W]: tree depths; a block slot of depth d stands where
    a chain would have put it, at slot ``P + d - first_depth`` (0 when the block starts with the root), which
    is what a sliding window counts: query q sees slot s only if ``q_slot - s < sliding_window``, as
    transformers' ``sliding_window_overlay`` on physical slots (sliding-window caches are compacted, so
    physical distance is position distance).

    ``dtype``: torch.bool (True = attend; sdpa and flex accept it) or a float dtype: additive, 0 or the
    dtype's minimum, as transformers' ``eager_mask`` (eager and sdpa accept it). Pass the model's dtype.
    Every query sees itself, so no row is fully masked.

        >>> m = tree_attention_mask(torch.tensor([[0, 1]]), torch.tensor([[[True, False], [True, True]]]),
        ...                         torch.tensor([[0, 1]]), torch.tensor([[0, 1]]), torch.bool)
        >>> m[0, 0].int().tolist()
        [[0, 1, 1, 0], [0, 1, 1, 1]]
    """
    batch, queries, width = visible.shape
    if isinstance(prefix, int):
        cached = torch.ones(batch, prefix, dtype=torch.bool, device=visible.device)
    else:
        cached = prefix.to(device=visible.device).bool()
    length = cached.shape[1]
    allowed = torch.cat([cached[:, None, :].expand(batch, queries, length), visible.bool()], dim=-1)
    if sliding_window is not None:
        query_slot = length + query_depths.to(visible.device) - first_depth  # [B, Q]
        key_slot = torch.cat([torch.arange(length, device=visible.device).expand(batch, length),
                              length + key_depths.to(visible.device) - first_depth], dim=1)  # [B, P + W]
        allowed = allowed & (query_slot[:, :, None] - key_slot[:, None, :] < sliding_window)
    allowed = allowed[:, None]
    if dtype == torch.bool:
        return allowed
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=visible.device)
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=visible.device), blocked)


class LevelAncestry:
    """What a KV-cached draft needs to read the expansion's levels (one ``step`` call of :func:`expand_tree`
    per level): the slots it fed so far this round (K per level) and which of them each new one sees.

        >>> ancestry = LevelAncestry()
        >>> ancestry.add(torch.tensor([[-1, -1]])).int().tolist()  # level 1: both see only themselves
        [[[1, 0], [0, 1]]]
        >>> ancestry.add(torch.tensor([[1, 1]])).int().tolist()  # level 2: both children of level-1 slot 1
        [[[0, 1, 1, 0], [0, 1, 0, 1]]]
        >>> ancestry.depths.tolist()
        [[1, 1, 2, 2]]
    """

    def __init__(self) -> None:
        self.visible: torch.Tensor | None = None  # [B, K, fed] what the last level's slots see
        self.depths: torch.Tensor | None = None  # [B, fed] depth of every slot fed this round

    def add(self, parents: torch.Tensor) -> torch.Tensor:
        """Record a level of K slots, ``parents`` [B, K] their parents among the previous level's K slots (-1:
        the root, which the draft read before the round). Returns [B, K, fed] bool: the fed slots each sees."""
        batch, k = parents.shape
        own = torch.eye(k, dtype=torch.bool, device=parents.device).expand(batch, k, k)
        if self.visible is None:
            self.visible, depth = own, 1
        else:
            rows = torch.arange(batch, device=parents.device)[:, None]
            self.visible = torch.cat([self.visible[rows, parents], own], dim=-1)
            depth = int(self.depths[0, -1]) + 1
        level_depths = torch.full((batch, k), depth, dtype=torch.long, device=parents.device)
        self.depths = level_depths if self.depths is None else torch.cat([self.depths, level_depths], dim=1)
        return self.visible

    def attention_mask(self, prefix: torch.Tensor | int, dtype: torch.dtype = torch.float32,
                       sliding_window: int | None = None) -> torch.Tensor:
        """The 4-D mask for feeding the last level after ``prefix`` (the draft cache before the round, root
        included: level-1 slots stand right after it)."""
        assert self.visible is not None and self.depths is not None
        k = self.visible.shape[1]
        return tree_attention_mask(prefix, self.visible, self.depths[:, -k:], self.depths, dtype, sliding_window,
                                   first_depth=1)


def _ancestor_closure(parents: torch.Tensor) -> torch.Tensor:
    """[B, W, W] bool: ``[b, i, j]`` when node j is node i or one of its ancestors, from ``parents`` [B, W] (-1 at
    the root). Pointer doubling (``A ∨ A·A``, ceil(log2 W) batched products) instead of one step per node: a
    64-node tree takes 7 products, not 64 rounds of gathers.

        >>> _ancestor_closure(torch.tensor([[-1, 0, 1, 0]])).int()[0].tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    """
    batch, width = parents.shape
    eye = torch.eye(width, dtype=torch.float32, device=parents.device).expand(batch, width, width)
    linked = torch.zeros(batch, width, width, dtype=torch.float32, device=parents.device)
    linked.scatter_(2, parents.clamp_min(0)[..., None], (parents >= 0).float()[..., None])  # i → its parent
    closure = torch.maximum(eye, linked)
    for _ in range(max(width - 1, 1).bit_length()):
        closure = torch.maximum(closure, (closure @ closure).clamp_max(1.0))
    return closure.bool()
