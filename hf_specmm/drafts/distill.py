"""Token-level distillation losses between the target's distribution p and the draft's q on the response
tokens, both restricted to the ids a draft may propose.

Why restrict both: at inference the draft's logits go through ``VocabMap.to_target``, which puts -inf on
ids the target reserves (image/video placeholders, an appended pad id) and on ids beyond the draft's
vocabulary, so q is a distribution over the *proposable* set S. The target's mass outside S can never be
matched: those tokens are never drafted. p restricted to S and renormalised is the optimum of both
objectives (for TVD, Σ_S min(p, q) ≤ p(S) with equality at q = p|S), so the losses compare p|S with q.

    >>> cols = proposable_columns(vocab)  # doctest: +SKIP
    >>> total, count = distill_loss(draft_logits, target_logits, labels, cols, "kl")  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..vocab import VocabMap


def proposable_columns(vocab: VocabMap) -> torch.Tensor:
    """Target-vocabulary ids the draft may propose (the complement of ``to_target``'s -inf mask). They are
    all inside the draft's vocabulary (ids are shared), so they index draft and target logits alike."""
    return vocab.proposable.nonzero().squeeze(-1)


def label_columns(labels: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Map target ids to their index in ``columns``; non-proposable ids -> -100 (ignored by CE)."""
    size = int(max(int(columns.max()), int(labels.max()) if labels.numel() else 0)) + 1
    lookup = torch.full((size,), -100, dtype=torch.long, device=columns.device)
    lookup[columns] = torch.arange(columns.numel(), device=columns.device)
    return lookup[labels.clamp(min=0).to(columns.device)]


def distill_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor | None, labels: torch.Tensor,
                 columns: torch.Tensor, kind: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Summed loss over N tokens (the caller divides by the step's token count) and detached metrics.

    ``draft_logits`` [N, Vd], ``target_logits`` [N, Vt] (unused for ``ce``), ``labels`` [N] target ids.
    ``kl``: Σ p log(p/q) (forward KL: mode-covering, rewards q for every token the target might say);
    ``tvd``: ½ Σ |p - q| (1 - TVD is the expected acceptance of a sampled draft token);
    ``ce``: -log q(label) on the response token (no target logits needed).
    """
    log_q = F.log_softmax(draft_logits.index_select(-1, columns).float(), dim=-1)
    metrics: dict[str, float] = {}
    with torch.no_grad():
        lab = label_columns(labels, columns)
        valid = lab >= 0
        metrics["draft_top1"] = float((log_q.argmax(-1) == lab)[valid].float().sum())
    if kind == "ce":
        return F.nll_loss(log_q, lab, ignore_index=-100, reduction="sum"), metrics
    assert target_logits is not None
    log_p = F.log_softmax(target_logits.index_select(-1, columns).float(), dim=-1)
    p = log_p.exp()
    with torch.no_grad():
        metrics["sampled_accept"] = float(torch.minimum(p, log_q.exp()).sum())  # Σ_S min(p, q)
        metrics["greedy_match"] = float((log_q.argmax(-1) == log_p.argmax(-1)).float().sum())
    if kind == "kl":
        loss = (p * (log_p - log_q)).sum()
    elif kind == "tvd":
        loss = 0.5 * (p - log_q.exp()).abs().sum()
    else:
        raise ValueError(f"unknown loss {kind!r}")
    return loss, metrics
