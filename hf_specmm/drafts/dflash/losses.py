"""DFlash's training loss (the ``dflash`` kind's ``DraftKind.loss``), the paper's recipe scaled down.

One teacher-forced target forward over ``[prompt | response]`` gives the features at the drafter's target layers
(captured by the training view's ``watch``, as at inference). Every valid response token r is an anchor: its
block ``[x_r, mask × (block_size - 1)]`` at positions ``pos(r)..`` attends to the context of every position
before r (its true features) and to its own block, all blocks in ONE drafter forward (a 4-D mask keeps them
apart). Block position j predicts response token r + j; its token loss (``--loss``, the target's distribution at
that token restricted to the proposable ids) is weighted ``exp(-(j - 1) / 4)`` (DFlash's decay: early positions
decide acceptance). Metrics: ``draft_top1`` is position 1's, ``block<j>_top1`` each position's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...drafter import Drafter
from ..distill import distill_loss
from .modeling import embed_block

DECAY = 4.0


def _training_masks(valid: torch.Tensor, anchors: torch.Tensor, positions: torch.Tensor, block: int,
                    window: int | None, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """[B, 1, R·block, L + R·block] additive masks: block r sees context slots before its anchor and itself."""
    batch, length = valid.shape
    blocks = anchors.shape[1]
    slot = torch.arange(length, device=valid.device)
    context = (slot[None, None, :] < anchors[:, :, None]) & valid[:, None, :]  # [B, R, L]
    context = context.repeat_interleave(block, 1)  # [B, R·block, L]
    own = torch.block_diag(*[torch.ones(block, block, dtype=torch.bool, device=valid.device)] * blocks)
    allowed = torch.cat([context, own[None].expand(batch, -1, -1)], -1)
    query_positions = (positions.gather(1, anchors)[:, :, None] + torch.arange(block, device=valid.device)).flatten(1)
    keys = torch.cat([positions, query_positions], 1)
    low = torch.finfo(dtype).min

    def additive(ok: torch.Tensor) -> torch.Tensor:
        return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill(~ok, low)[:, None]

    full = additive(allowed)
    if not window:
        return {"full_attention": full, "sliding_attention": full}
    near = (query_positions[:, :, None] - keys[:, None, :]).abs() < window
    return {"full_attention": full, "sliding_attention": additive(allowed & near)}


def dflash_loss(view: Drafter, batch: Any, target_logits: torch.Tensor | None, cfg: Any,
                columns: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Summed, decay-weighted loss over every anchor's block positions and summed metrics (see module doc)."""
    draft, target = view.model, view.target
    features = view._take()
    valid = batch.full_mask.bool()
    prompt, width = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
    block = draft.config.block_size
    positions = (batch.full_mask.long().cumsum(-1) - 1).clamp_min(0)
    anchors = (prompt + torch.arange(width, device=valid.device)).expand(valid.shape[0], width)
    ids = torch.full((valid.shape[0], width, block), draft.config.mask_token_id, dtype=torch.long, device=valid.device)
    ids[:, :, 0] = batch.response_ids
    query_positions = (positions.gather(1, anchors)[:, :, None] + torch.arange(block, device=valid.device)).flatten(1)
    dtype = draft.dtype
    masks = _training_masks(valid, anchors, positions, block, view.window, dtype)
    out = draft(noise_embeds=embed_block(target, ids.flatten(1)).to(dtype), context_hidden_states=features.to(dtype),
                attention_mask=masks, position_ids=torch.cat([positions, query_positions], 1), use_cache=False)
    hidden = out.last_hidden_state.view(valid.shape[0], width, block, -1)
    head = target.get_output_embeddings()
    total, metrics = 0.0, {}
    for j in range(1, block):
        if j >= width:
            break
        # anchor r's position j predicts response token r + j (both real answer tokens)
        sel = batch.response_mask[:, :width - j] & batch.response_mask[:, j:]
        logits = head(hidden[:, :width - j, j][sel])
        t_logits = None if target_logits is None or cfg.loss == "ce" else target_logits[:, j:][sel]
        loss, step = distill_loss(logits, t_logits, batch.response_ids[:, j:][sel], columns, cfg.loss)
        total = total + math.exp(-(j - 1) / DECAY) * loss
        metrics[f"block{j}_top1"] = step["draft_top1"]
        if j == 1:
            metrics.update(step)
    return total, metrics
