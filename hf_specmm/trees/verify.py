"""Verification of a :class:`DraftTree` against the target's distributions at its N + 1 nodes, and the
:class:`Acceptance` every verifier returns (a chain's as well: a chain is the tree whose accepted root path is
its prefix ``0..n``).

Glossary, per row of one round (the words mean this everywhere in hf_specmm)::

    drafted   d_1..d_γ (a chain) or the tree's N nodes: what the drafter proposed
    accepted  n ≤ γ: the drafts the verifier took (a tree: the depth of the accepted path's last node)
    bonus     the target's own token after the accepted drafts: its correction at the first rejection, or its
              next token when every draft on the path was accepted; ``emitted[n]``
    emitted   ``emitted[:n + 1]``: the accepted drafts, then the bonus token (what the verifier offers the row)
    kept      k ≤ n + 1: what the row keeps of the emitted tokens (what plain ``generate`` would: it stops at EOS
              or max_length); 0 for a finished row. ``keep = k - 1`` drafts stay in both caches, and
              ``emitted[keep]`` is the next round's current token (``cur``, the root of the next tree)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass(frozen=True)
class Acceptance:
    """What a verifier keeps of a block, per cache row (a chain's or a tree's): ``n`` [A] accepted drafts;
    ``emitted`` [A, D+1] whose first ``n + 1`` entries are the row's new tokens (the accepted drafts, then the
    bonus token at index ``n``); ``path`` [A, D+1]: the block positions those tokens were scored at, root first
    (past ``n`` it repeats the last accepted node), or None for a chain (its prefix ``0..n``). The target's cache
    keeps slots ``start + path[:, :keep + 1]`` of a tree block (root included).

        >>> acc = Acceptance(torch.tensor([1]), torch.tensor([[7, 9, 0]]))
        >>> acc.next_tokens.tolist(), acc.token_at(torch.tensor([0])).tolist()
        ([9], [7])
    """

    n: torch.Tensor
    emitted: torch.Tensor
    path: torch.Tensor | None = None

    @property
    def next_tokens(self) -> torch.Tensor:
        """[A] the bonus token: the target's token after the accepted drafts (the next round's root)."""
        return self.token_at(self.n)

    @property
    def path_valid(self) -> torch.Tensor:
        """[A, D+1] bool: which entries of ``path`` are accepted (root and the n accepted nodes)."""
        return torch.arange(self.emitted.shape[1], device=self.n.device)[None] <= self.n[:, None]

    def offered(self, unfinished: torch.Tensor) -> torch.Tensor:
        """[A] tokens each row offers to the stopping criteria (none for a finished row)."""
        return torch.where(unfinished, self.n + 1, torch.zeros_like(self.n))

    def token_at(self, keep: torch.Tensor) -> torch.Tensor:
        """[A] the emitted token at index ``keep`` [A] of each row (after ``keep`` kept drafts: its next current token)."""
        return self.emitted.gather(1, keep[:, None]).squeeze(1)


def _acceptance(tree: DraftTree, last: torch.Tensor, next_tokens: torch.Tensor) -> Acceptance:
    path = tree.path_to(last)
    n = tree.depths.gather(1, last[:, None])[:, 0]
    emitted = torch.cat([tree.tokens.gather(1, path)[:, 1:], torch.zeros_like(next_tokens)[:, None]], dim=1)
    return Acceptance(n, emitted.scatter(1, n[:, None], next_tokens[:, None]), path)


def greedy_verify_tree(tree: DraftTree, target_scores: torch.Tensor) -> Acceptance:
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
                       generator: torch.Generator | None = None) -> Acceptance:
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
