"""Verification of a :class:`DraftTree` against the target's distributions at its N + 1 nodes.

Both rules return a :class:`TreeAcceptance`: the accepted root path and the row's new tokens, laid out as
the chain verifiers' ``(n, emitted)`` (``hf_specmm.verify``) so the loop emits them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass(frozen=True)
class TreeAcceptance:
    """``n`` [B] accepted draft nodes per row; ``path`` [B, D+1] the accepted root path's nodes by depth (root
    first; past ``n`` it repeats the last accepted node); ``emitted`` [B, D+1] the row's new tokens: the
    accepted path's tokens, then at index ``n`` the target's token at the last accepted node (correction or
    bonus). The target's cache keeps slots ``start + path[:, :n+1]`` of the tree block (root included)."""

    n: torch.Tensor
    path: torch.Tensor
    emitted: torch.Tensor

    @property
    def next_tokens(self) -> torch.Tensor:
        """[B] the target's token after the accepted path (the next round's root)."""
        return self.emitted.gather(1, self.n[:, None])[:, 0]

    @property
    def path_valid(self) -> torch.Tensor:
        """[B, D+1] bool: which entries of ``path`` are accepted (root and the n accepted nodes)."""
        return torch.arange(self.path.shape[1], device=self.n.device)[None] <= self.n[:, None]


def _acceptance(tree: DraftTree, last: torch.Tensor, next_tokens: torch.Tensor) -> TreeAcceptance:
    path = tree.path_to(last)
    n = tree.depths.gather(1, last[:, None])[:, 0]
    emitted = torch.cat([tree.tokens.gather(1, path)[:, 1:], torch.zeros_like(next_tokens)[:, None]], dim=1)
    return TreeAcceptance(n, path, emitted.scatter(1, n[:, None], next_tokens[:, None]))


def greedy_verify_tree(tree: DraftTree, target_scores: torch.Tensor) -> TreeAcceptance:
    """Accept the longest root path whose every node's token is the target's argmax at its parent
    (``target_scores`` [B, N+1, V], the target's processed scores at every node), plus the target's argmax at
    the last accepted node. Two matching paths of the same depth (only with repeated sibling tokens) resolve
    to the lower node index.

        >>> tree = DraftTree.from_parents(torch.tensor([[0, 1, 2]]), torch.tensor([[-1, 0, 0]]))
        >>> scores = torch.nn.functional.one_hot(torch.tensor([[2, 0, 1]]), 3).float()  # argmax 2 at the root
        >>> acc = greedy_verify_tree(tree, scores)
        >>> acc.n.tolist(), acc.emitted.tolist()
        ([1], [[2, 1]])
    """
    argmax = target_scores.argmax(-1)  # [B, N+1]
    chosen_at_parent = argmax.gather(1, tree.parents.clamp_min(0))
    match = (tree.tokens == chosen_at_parent) & tree.valid
    match[:, 0] = True
    accepted = ~(tree.ancestors & ~match[:, None, :]).any(-1)  # every node on the root path matches
    last = torch.where(accepted, tree.depths + 1, torch.zeros_like(tree.depths)).argmax(-1)  # deepest, lowest index
    return _acceptance(tree, last, argmax.gather(1, last[:, None])[:, 0])


def sample_verify_tree(tree: DraftTree, target_probs: torch.Tensor,
                       generator: torch.Generator | None = None) -> TreeAcceptance:
    """Lossless multi-candidate speculative sampling over a tree of deterministically chosen children (EAGLE's
    rule; SpecInfer's with a point-mass draft). From the root, with p the target's distribution at the
    current node: its valid children x are tried in node order; x is accepted with probability p(x), else
    p <- normalize(p with x zeroed) and the next sibling is tried. An accepted child becomes the current node
    (p its own target distribution); when every child was rejected (or there is none) the next token is
    sampled from p. Each emitted token is thus distributed as the target's: child x is accepted with
    probability p(x) exactly, and the residual is p restricted to the untried tokens.

    ``target_probs`` [B, N+1, V]: the target's (processed) probabilities at every node. The children's draft
    probabilities are not needed: the candidates are a function of the draft alone, never of the draws here.
    """
    batch, width = tree.tokens.shape
    device = target_probs.device
    rows = torch.arange(batch, device=device)
    nodes = torch.arange(width, device=device)
    # each node's rank among its valid siblings (the order they are tried in)
    siblings = (tree.parents[:, :, None] == tree.parents[:, None, :]) & tree.valid[:, None, :]
    rank = (siblings & (nodes[None, None, :] < nodes[None, :, None])).sum(-1)  # [B, N+1]
    child = tree.valid & (tree.parents >= 0)
    max_children = int(torch.where(child, rank + 1, torch.zeros_like(rank)).max()) if width > 1 else 0
    current = torch.zeros(batch, dtype=torch.long, device=device)
    probs = target_probs[:, 0].clone()
    searching = torch.ones(batch, dtype=torch.bool, device=device)  # rows still walking down the tree
    for _ in range(int(tree.depths.max()) if width > 1 else 0):
        moved = torch.zeros(batch, dtype=torch.bool, device=device)
        for r in range(max_children):
            candidate = child & (tree.parents == current[:, None]) & (rank == r)
            has = candidate.any(-1) & searching & ~moved
            index = candidate.long().argmax(-1)
            token = tree.tokens[rows, index]
            p_token = probs[rows, token]
            u = torch.rand(batch, device=device, dtype=probs.dtype, generator=generator)
            accept = has & (u < p_token)
            reject = has & ~accept
            # rejected: zero the token, renormalize the residual (kept as is if nothing would be left)
            zeroed = probs.scatter(1, token[:, None], 0.0)
            total = zeroed.sum(-1, keepdim=True)
            residual = torch.where(total > 0, zeroed / total.clamp_min(torch.finfo(probs.dtype).tiny), probs)
            probs = torch.where(reject[:, None], residual, probs)
            current = torch.where(accept, index, current)
            moved |= accept
        probs = torch.where(moved[:, None], target_probs[rows, current], probs)
        searching &= moved
    next_tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return _acceptance(tree, current, next_tokens)
