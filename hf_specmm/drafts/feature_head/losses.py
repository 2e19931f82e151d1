"""EAGLE's training loss for a feature head (the ``feature_head`` kind's ``DraftKind.loss``).

One teacher-forced pass over ``[prompt | response]``: at every position t the head reads the target's input
embedding of x_t and its true feature f_{t-1} (as at inference: ``previous_features``) and predicts g_t ≈ f_t.
On the answer positions (those whose prediction drafts a response token: g at the position of response
token r drafts token r + 1)::

    loss = feature_loss_weight · SmoothL1(g, f)  +  token_loss_weight · distill(lm_head(g), target)

``distill`` is the trainer's own token loss (``--loss kl|tvd|ce``) through the target's frozen LM head,
restricted to the ids a draft may propose. EAGLE-1's weights are 1 and 0.1.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ... import _compat
from ...drafter import Drafter
from ...targets import target_family
from ..distill import distill_loss
from .drafter import previous_features


def feature_head_loss(view: Drafter, batch: Any, target_logits: torch.Tensor | None, cfg: Any,
                      columns: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Summed loss over the batch's drafted answer positions and summed metrics (see module doc).

    ``view`` is the :class:`FeatureHeadDrafter` that watched the target's forward over ``batch.full_ids``;
    ``target_logits`` [B, R, V]: column r is the target's logits predicting response token r.
    """
    head = view.model
    embeds, features = view._take()
    if embeds is None or not view.reads_target_embeddings:
        embeds = head.embed(batch.full_ids)
    mask = batch.full_mask.bool()
    slots, positions = view.prompt_slots(mask, batch.full_ids, view.positions.prompt_positions(mask.long()))
    out = head(features=previous_features(features, mask), inputs_embeds=embeds, attention_mask=slots.long(),
               position_ids=positions, use_cache=False)  # the slots it reads at inference, at their positions
    prompt, width = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
    sel = batch.response_mask[:, 1:]  # the prediction at response position r drafts token r + 1
    g = out.hidden_states[:, prompt : prompt + width - 1][sel]
    f = features[:, prompt : prompt + width - 1].to(g.device)[sel]
    regression = F.smooth_l1_loss(g.float(), f.float(), reduction="none").mean(-1).sum()
    t_logits = None if target_logits is None or cfg.loss == "ce" else target_logits[:, 1:][sel]
    token, metrics = distill_loss(head.lm_logits(g), t_logits, batch.response_ids[:, 1:][sel], columns, cfg.loss)
    metrics["feature_l1"] = float(regression.detach())
    loss = cfg.feature_loss_weight * regression + cfg.token_loss_weight * token
    return loss, metrics


def ttt_mask(valid: torch.Tensor, step: int, eager: bool, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, L, (step + 1)·L] attention of training-time-test step ``step`` over the keys of steps 0..step:
    index t attends to the true slots s <= t (step 0) and to its own drafted slots (index t of steps 1..step),
    which is what drafting step ``step`` + 1 after a prefix ending at t attends to at inference."""
    batch, width = valid.shape
    index = torch.arange(width, device=valid.device)
    true = (index[None, :] <= index[:, None])[None] & valid[:, None, :]
    own = torch.eye(width, dtype=torch.bool, device=valid.device)[None].expand(batch, -1, -1)
    allowed = torch.cat([true] + [own] * step, -1)[:, None]
    if not eager:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=valid.device).masked_fill(~allowed, torch.finfo(dtype).min)


def eagle3_loss(view: Drafter, batch: Any, target_logits: torch.Tensor | None, cfg: Any,
                columns: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """EAGLE-3's training-time test over ``cfg.ttt_steps`` = K unrolled steps (the ``eagle3`` kind's loss).

    Step 0 is teacher-forced like EAGLE-1 (index t reads emb(x_t) and the fused target layers at t - 1). Step
    k reads emb(x_{t+k}) and the head's own output of step k - 1 at the same index, at position t + k, and
    attends to the true slots up to t plus its own earlier steps at t: exactly drafting step k + 1 after a
    prefix ending at t. Every step's prediction of a response token is scored with the token loss (``--loss``,
    target distribution restricted to the draft vocabulary), step k weighted ``cfg.ttt_decay`` ** k.
    Metrics: ``draft_top1`` is step 0's, ``ttt<k>_top1`` each step's.
    """
    head = view.model
    embeds, features = view._take()
    if embeds is None:
        embeds = head.embed(batch.full_ids)
    valid = batch.full_mask.bool()
    positions = target_family(view.target).positions.bind(view.target, batch.prompt_ids, batch.prompt_mask,
                                                          batch.inputs).prompt_positions(batch.full_mask.long())
    keep = columns[head.t2d.to(columns.device)[columns]]  # proposable ids inside the draft vocabulary
    eager = head.config.text_config._attn_implementation == "eager"
    prompt, width = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
    steps = int(getattr(cfg, "ttt_steps", None) or 3)  # None: EAGLE-3's default
    cache = _compat.new_dynamic_cache()
    feature, total, metrics = previous_features(features, valid), 0.0, {}
    for k in range(min(steps, width - 1)):
        shifted = F.pad(embeds[:, k:], (0, 0, 0, k))  # index t reads the token at t + k
        out = head(features=feature, inputs_embeds=shifted, attention_mask=ttt_mask(valid, k, eager, head.fc.weight.dtype),
                   position_ids=(positions + k).to(head.fc.weight.device), cache=cache, use_cache=True)
        sel = batch.response_mask[:, k + 1:]  # index P + j predicts response token j + k + 1
        g = out.hidden_states[:, prompt: prompt + width - 1 - k][sel]
        t_logits = None if target_logits is None or cfg.loss == "ce" else target_logits[:, k + 1:][sel]
        loss, step_metrics = distill_loss(head.lm_logits(g), t_logits, batch.response_ids[:, k + 1:][sel], keep, cfg.loss)
        total = total + float(getattr(cfg, "ttt_decay", None) or 1.0) ** k * loss
        metrics[f"ttt{k}_top1"] = step_metrics["draft_top1"]
        if k == 0:
            metrics.update(step_metrics)
        feature = out.hidden_states
    return total, metrics
