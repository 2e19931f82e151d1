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

from ...drafter import Drafter
from .drafter import previous_features


def feature_head_loss(view: Drafter, batch: Any, target_logits: torch.Tensor | None, cfg: Any,
                      columns: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Summed loss over the batch's drafted answer positions and summed metrics (see module doc).

    ``view`` is the :class:`FeatureHeadDrafter` that watched the target's forward over ``batch.full_ids``;
    ``target_logits`` [B, R, V]: column r is the target's logits predicting response token r.
    """
    from ...train.losses import distill_loss

    head = view.model
    embeds, features = view._take()
    if embeds is None:
        embeds = head.embed(batch.full_ids)
    mask = batch.full_mask.bool()
    out = head(features=previous_features(features, mask), inputs_embeds=embeds, attention_mask=mask.long(),
               position_ids=view.positions.prompt_positions(mask.long()), use_cache=False)
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
