"""The chain verification rules, greedy and lossless sampling: plain functions a :class:`~hf_specmm.block.ChainBlock`
calls (a tree block calls :func:`~hf_specmm.trees.greedy_verify_tree` / :func:`~hf_specmm.trees.sample_verify_tree`).

Notation (Leviathan et al. 2211.17192, Chen et al. 2302.01318): the draft proposed d_1..d_γ with
probabilities q_j; the target's (processed) distributions at the γ+1 positions are p_0..p_γ. The chain rules
return ``(n, emitted)``: ``n`` [B] accepted drafts per row and ``emitted`` [B, γ+1], whose first ``n + 1``
entries are the row's new tokens (accepted drafts, then the correction or bonus): the fields of an
:class:`~hf_specmm.trees.Acceptance` (the words accepted / emitted / bonus / kept are defined there, once).
"""

from __future__ import annotations

import torch


def greedy_verify(drafts: torch.Tensor, target_scores: torch.Tensor,
                  lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept the longest prefix of ``drafts`` [B, γ] equal to the target's argmax; ``target_scores`` [B, γ+1, V].
    ``lengths`` [B]: row i proposed only its first ``lengths[i]`` drafts (None: all γ)."""
    target_tokens = target_scores.argmax(-1)  # a_0..a_γ
    gamma = drafts.shape[1]
    n = (drafts == target_tokens[:, :gamma]).long().cumprod(-1).sum(-1)
    if lengths is not None:
        n = torch.minimum(n, lengths)
    return n, target_tokens  # accepted drafts equal the target's tokens, so emitted = a_0..a_n


def rejection_sample(
    drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling: d_j kept with probability min(1, p_j(d_j)/q_j(d_j)); at the first rejection
    sample from norm(max(0, p_j - q_j)); if all γ are kept, sample the bonus token from p_γ.

    ``drafts`` [B, γ], ``q`` [B, γ, V] draft probabilities, ``p`` [B, γ+1, V] target probabilities.
    ``lengths`` [B]: row i proposed only its first ``lengths[i]`` drafts; past them it has no draft (q = 0),
    so a row that keeps all of its own drafts takes its next token from p exactly (the bonus rule).
    """
    batch, gamma = drafts.shape
    p_d = p[:, :gamma].gather(-1, drafts[..., None]).squeeze(-1)
    q_d = q.gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.rand(batch, gamma, device=p.device, dtype=p.dtype, generator=generator)
    accept = u * q_d < p_d
    if lengths is not None:
        proposed = torch.arange(gamma, device=p.device)[None] < lengths[:, None]
        accept &= proposed
        q = q * proposed[..., None]
    n = accept.long().cumprod(-1).sum(-1)
    # treating the bonus position as a draft with q = 0 makes its residual exactly p_γ
    q_ext = torch.cat([q, q.new_zeros(batch, 1, q.shape[-1])], dim=1)
    idx = n[:, None, None].expand(batch, 1, p.shape[-1])
    p_n, q_n = p.gather(1, idx).squeeze(1), q_ext.gather(1, idx).squeeze(1)
    residual = (p_n - q_n).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp_min(torch.finfo(p.dtype).tiny), p_n)
    correction = torch.multinomial(residual, 1, generator=generator)
    emitted = torch.cat([drafts, drafts.new_zeros(batch, 1)], dim=1).scatter(1, n[:, None], correction)
    return n, emitted

