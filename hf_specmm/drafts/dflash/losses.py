"""DFlash's training loss (the ``dflash`` kind's ``DraftKind.loss``), the paper's recipe scaled down.

One teacher-forced target forward over ``[prompt | response]`` gives the features at the drafter's target layers
(captured by the training view's ``watch``, as at inference). Every valid response token r is an anchor: its
block ``[x_r, mask × (block_size - 1)]`` at positions ``pos(r)..`` attends to the context of every position
before r (its true features) and to its own block, all blocks in ONE drafter forward (a 4-D mask keeps them
apart). As the paper, the anchors are drawn at random: at most ``cfg.anchors`` (:data:`ANCHORS` unset) distinct answer
tokens per line (every one of a shorter answer), fresh each step (torch's seeded generator); the sums are scaled by answer tokens /
anchors drawn, so loss and metrics estimate the every-anchor sums the step's token count divides. Block position
j predicts response token r + j; its token loss (``--loss``, the target's distribution at that token restricted
to the proposable ids) is weighted ``exp(-(j - 1) / decay)`` (DFlash's decay: early positions decide acceptance),
``decay`` the paper's for the block size (:func:`loss_decay`: 4 for blocks of 8, 5 for 10, 7 for 16).
Metrics: ``draft_top1`` is position 1's, ``block<j>_top1`` each position's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...drafter import Drafter
from ..distill import distill_loss
from .modeling import embed_block

# anchors drawn per answer line: a block costs block_size queries over context + blocks keys, so every answer
# token as an anchor made a world step (48 answer tokens × blocks of 16) 5.4 s on one core; DFlash samples anchors
# (at most 512 per sequence of up to 3k tokens, about one position in six): 8 of a 48-token answer is the same share
ANCHORS = 8


def loss_decay(block_size: int) -> float:
    """The decay γ of the position weights ``exp(-(j - 1) / γ)``: the paper's 7 / 5 / 4 for blocks of 16 / 10 /
    8, linear between them and beyond (a longer block spreads its weight over more positions)."""
    if block_size <= 10:
        return max(1.0, 4.0 + (block_size - 8) / 2)
    return 5.0 + (block_size - 10) / 3


def sample_anchors(response_mask: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` distinct answer-token indices per row, drawn uniformly among the row's answer tokens, sorted
    ([B, count]), and which of them are real ([B, count]: a row with fewer answer tokens keeps them all)."""
    count = min(count, response_mask.shape[1])
    scores = torch.rand(response_mask.shape, device=response_mask.device).masked_fill(~response_mask, -1.0)
    picked = scores.topk(count, dim=1).indices.sort(dim=1).values
    return picked, response_mask.gather(1, picked)


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
    answer = batch.response_mask.bool()
    picked, kept = sample_anchors(answer, cfg.anchors or ANCHORS)  # [B, R] answer indices and which are real
    anchors = prompt + picked
    ids = torch.full((*picked.shape, block), draft.config.mask_token_id, dtype=torch.long, device=valid.device)
    ids[:, :, 0] = batch.response_ids.gather(1, picked)
    query_positions = (positions.gather(1, anchors)[:, :, None] + torch.arange(block, device=valid.device)).flatten(1)
    dtype = draft.dtype
    masks = _training_masks(valid, anchors, positions, block, view.window, dtype)
    out = draft(noise_embeds=embed_block(target, ids.flatten(1)).to(dtype), context_hidden_states=features.to(dtype),
                attention_mask=masks, position_ids=torch.cat([positions, query_positions], 1), use_cache=False)
    hidden = out.last_hidden_state.view(*picked.shape, block, -1)
    head = target.get_output_embeddings()
    scale = float(answer.sum()) / max(float(kept.sum()), 1.0)  # every-anchor sums, estimated from the drawn ones
    decay = loss_decay(block)
    total, metrics = 0.0, {}
    for j in range(1, block):
        # anchor r's position j predicts answer token r + j (both real answer tokens)
        index = (picked + j).clamp_max(width - 1)
        sel = kept & (picked + j < width) & answer.gather(1, index)
        if not sel.any():
            break
        logits = head(hidden[:, :, j][sel])
        t_logits = None
        if target_logits is not None and cfg.loss != "ce":
            t_logits = target_logits[:, :width].gather(
                1, index[..., None].expand(-1, -1, target_logits.shape[-1]))[sel]
        loss, step = distill_loss(logits, t_logits, batch.response_ids.gather(1, index)[sel], columns, cfg.loss)
        total = total + math.exp(-(j - 1) / decay) * scale * loss
        metrics[f"block{j}_top1"] = scale * step["draft_top1"]
        if j == 1:
            metrics.update({k: scale * v for k, v in step.items()})
    return total, metrics
