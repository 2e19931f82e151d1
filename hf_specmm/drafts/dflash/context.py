"""The DFlash drafter's KV cache: keys and values of the target's context features, per row, with holes.

A DFlash layer's keys are ``k_proj([context; block])``: the projected target features of every accepted
position (the *context*), then the block being denoised (the anchor token and γ mask tokens). Only the
context is ever kept. :meth:`ContextCache.update` (the transformers ``Cache.update`` the drafter's attention
calls) appends the round's new context slots for good and writes the block behind them in scratch room,
overwritten next round: rolling back the block costs nothing, and no concatenation per round copies the
cache (capacity grows by doubling).

Rows of a batch accept different numbers of tokens per round, so they append different numbers of context
slots; the shorter ones are left-padded with holes (mask 0), as every cache of the loop handles them. Each
slot keeps its position, so the mask (bidirectional, with the drafter's sliding windows) is built from
positions, never from slot indices.
"""

from __future__ import annotations

from typing import Any

import torch


class ContextCache:
    """Context keys / values of every drafter layer, their slot mask [B, S] and positions [B, S]."""

    def __init__(self, num_layers: int, batch_size: int, device: torch.device):
        self.num_layers, self.batch_size, self.device = num_layers, batch_size, device
        self.length = 0  # context slots written
        self.keys: list[torch.Tensor | None] = [None] * num_layers  # [B, heads, capacity, D]
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        self.positions = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        self._new = 0  # context slots of the forward under way (the rest of its keys: the block)

    def begin(self, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Start a forward that appends ``valid`` / ``positions`` [B, k] context slots before its block."""
        self._new = valid.shape[1]
        self.valid = torch.cat([self.valid, valid.to(self.device)], 1)
        self.positions = torch.cat([self.positions, positions.to(self.device)], 1)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the first ``k`` slots of ``key_states`` [B, heads, k + block, D] (the new context) and return
        every context slot followed by the block."""
        total = self.length + key_states.shape[2]
        cache_k, cache_v = self.keys[layer_idx], self.values[layer_idx]
        if cache_k is None or cache_k.shape[2] < total:  # grow by doubling
            capacity = max(total, 2 * (0 if cache_k is None else cache_k.shape[2]))
            grown_k = key_states.new_zeros(*key_states.shape[:2], capacity, key_states.shape[3])
            grown_v = value_states.new_zeros(*value_states.shape[:2], capacity, value_states.shape[3])
            if cache_k is not None:
                grown_k[:, :, :self.length] = cache_k[:, :, :self.length]
                grown_v[:, :, :self.length] = cache_v[:, :, :self.length]
            self.keys[layer_idx], self.values[layer_idx] = cache_k, cache_v = grown_k, grown_v
        cache_k[:, :, self.length:total] = key_states
        cache_v[:, :, self.length:total] = value_states
        if layer_idx == self.num_layers - 1:
            self.length += self._new  # the block's slots are scratch: overwritten next round
        return cache_k[:, :, :total], cache_v[:, :, :total]

    def reserve(self, width: int) -> None:
        """Nothing to do: :meth:`update` grows the buffers, and a context slot never moves."""

    def rollback(self, start: int, counts: torch.Tensor, path: torch.Tensor | None = None) -> None:
        """Keep slots ``[0, start)`` and, per row, the first ``counts[b]`` after them (the rest become holes).
        The block is scratch, so keeping what the round's forward read (``start`` + its pending context) is
        free; a block drafter keeps no drafted slot, so there is never a tree ``path`` to gather."""
        if path is not None:
            raise ValueError("a context cache keeps no drafted slot: there is no tree path to gather")
        width = int(counts.max()) if counts.numel() else 0
        self.length = start + width
        self.valid, self.positions = self.valid[:, :self.length], self.positions[:, :self.length]
        after = torch.arange(width, device=self.device)[None] < counts.to(self.device)[:, None]
        self.valid[:, start:] &= after

    def select_rows(self, keep: torch.Tensor) -> None:
        keep = keep.to(self.device)
        self.batch_size = int(keep.shape[0])
        self.valid, self.positions = self.valid[keep], self.positions[keep]
        self.keys = [None if k is None else k[keep] for k in self.keys]
        self.values = [None if v is None else v[keep] for v in self.values]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length


def block_masks(context_valid: torch.Tensor, context_positions: torch.Tensor, block_positions: torch.Tensor,
                window: int | None, dtype: torch.dtype, from_anchor: bool = False,
                causal_sliding: bool = False) -> dict[str, torch.Tensor]:
    """Additive 4-D masks [B, 1, block, context + block] of the block's queries: every valid context slot
    and the whole block (bidirectional), for full layers; within ``window`` positions of each query for sliding
    ones (transformers' window), or of the block's anchor (``from_anchor``: the context positions
    ``[anchor - window, anchor)`` and the whole block, speculators' window); ``causal_sliding``: sliding layers
    see the block causally (speculators' ``sliding_window_non_causal=False``)."""
    block = block_positions.shape[1]
    valid = torch.cat([context_valid, context_valid.new_ones(context_valid.shape[0], block)], 1)
    keys = torch.cat([context_positions, block_positions], 1)
    seen = valid[:, None, :].expand(-1, block, -1)
    if from_anchor:  # block keys sit at the anchor's position or after it: always inside
        near = keys[:, None, :] >= block_positions[:, :1, None] - (window or 0)
    else:
        near = (block_positions[:, :, None] - keys[:, None, :]).abs() < (window or 0)
    if causal_sliding:  # every context key precedes the block: only the block's later keys drop out
        near = near & (keys[:, None, :] <= block_positions[:, :, None])
    low = torch.finfo(dtype).min

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, low)[:, None]

    full = additive(seen)
    return {"full_attention": full, "sliding_attention": additive(seen & near) if window else full}
