"""A model's KV cache plus the 2-D mask of its physical slots.

Rows of a batch accept different numbers of drafted tokens per round. Instead of shifting each row's
cache (a copy of the whole cache per round), the rejected slots of the shorter rows stay in place as
*holes* (mask 0) and the cache is only cropped to the longest row: rollback is a slice, never a
re-prefill. A token's rotary position is the number of valid slots before it, which is exactly how
plain ``generate`` numbers left-padded prompts (``cumsum(mask) - 1``).

Sliding-window models (Gemma 3) are the exception: their window counts physical slots, so a hole would
push a token out of a row's window that plain generate keeps in it. Their caches are kept with full
layers (``_compat.new_dynamic_cache``; the mask applies the window) and ``compact=True`` moves each row's
holes to its left end after every rollback (one gather per round with holes): every row is then a
left-padded sequence again, and its window covers exactly the tokens plain generate's does.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _compat
from .targets.positions import ROPE_1D, Rope1D


class SlottedCache:
    def __init__(self, cache: Any, mask: torch.Tensor | None, length: int, batch_size: int, device: torch.device,
                 positions: Rope1D = ROPE_1D, compact: bool = False):
        self.cache = cache
        self.compact = compact  # move holes to the left after each rollback (sliding-window models)
        self.positions = positions  # the model's position rule (the one training uses too)
        self.mask = mask  # [B, length] long, or None while every slot is valid (no padding, no holes)
        self.length = length
        self.batch_size = batch_size
        self.device = device

    def _next_positions(self) -> torch.Tensor:
        if self.mask is None:
            return torch.full((self.batch_size,), self.length, dtype=torch.long, device=self.device)
        return self.mask.sum(-1)

    def block_inputs(self, valid: torch.Tensor | None, width: int) -> dict[str, torch.Tensor | None]:
        """Attention mask and position ids for feeding ``width`` new slots (``valid`` [B, width] or None = all)."""
        positions = self.positions.block_positions(self._next_positions(), valid, width)
        if valid is None:
            mask = None if self.mask is None else torch.cat([self.mask, self.mask.new_ones(self.batch_size, width)], 1)
        else:
            valid = valid.long()
            old = self.mask if self.mask is not None else valid.new_ones(self.batch_size, self.length)
            mask = torch.cat([old, valid], dim=1)
        return {"attention_mask": mask, "position_ids": positions}

    def commit(self, attention_mask: torch.Tensor | None, width: int) -> None:
        """Record that ``width`` slots were written with the mask returned by :meth:`block_inputs`."""
        self.mask = attention_mask
        self.length += width

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` [k] (finished rows leave the batch: later forwards skip them)."""
        _compat.select_cache_rows(self.cache, keep)
        if self.mask is not None:
            self.mask = self.mask[keep.to(self.mask.device)]
        self.positions = self.positions.select(keep)
        self.batch_size = int(keep.numel())

    def rollback(self, keep_from: int, valid: torch.Tensor) -> None:
        """Keep slots ``[0, keep_from + valid.shape[1])``; ``valid`` [B, k] marks which of the last k stay valid."""
        new_length = keep_from + valid.shape[1]
        _compat.crop_cache(self.cache, new_length)
        if self.mask is None and bool(valid.all()):
            self.length = new_length
            return
        old = self.mask[:, :keep_from] if self.mask is not None else valid.new_ones(self.batch_size, keep_from)
        self.mask = torch.cat([old.long(), valid.long()], dim=1)
        self.length = new_length
        if self.compact and not bool(valid.all()):
            # stable sort: holes first, each row's valid slots keep their order
            self.mask, order = torch.sort(self.mask, dim=1, stable=True)
            _compat.reorder_cache_slots(self.cache, order)
