"""The dynamic backend: transformers' ``DynamicCache`` (full layers), cropped to the kept prefix."""

from __future__ import annotations

from typing import Any

import torch

from .. import _compat
from ..targets.positions import ROPE_1D, PositionRule
from .base import Backend, SlottedCache
from .short_conv import linear_states  # every stateful kind (linear attention, short convolutions)


class DynamicSlottedCache(SlottedCache):
    """A :class:`SlottedCache` over a ``DynamicCache``: rollback crops (no copy), leaving rows select rows."""

    def forward_kwargs(self) -> dict[str, Any]:
        return _compat.cache_kwargs(self.cache)

    def _keep_prefix(self, length: int) -> None:
        _compat.crop_cache(self.cache, length)

    def _select_storage(self, keep: torch.Tensor) -> None:
        _compat.select_cache_rows(self.cache, keep)

    def _gather_slots(self, start: int, index: torch.Tensor) -> None:
        _compat.gather_cache_slots(self.cache, start, index)


class DynamicBackend(Backend):
    """Makes the call's caches. The one place that decides how a model's cache is laid out: sliding-window
    models get full layers and compaction (see :mod:`hf_specmm.caches.base`)."""

    name = "dynamic"
    drops_rows = True  # finished rows leave the caches (later rounds run only the others)

    @staticmethod
    def compacts(model: Any) -> bool:
        """Whether ``model``'s caches move holes left after each rollback (it attends through a window)."""
        config = getattr(model, "config", None)
        return config is not None and (_compat.has_sliding_layers(config) or _compat.distances_by_column(config))

    #: windows count slots from each row's left end: a sliding-window model's prompt must be left-padded
    requires_left_padding = compacts

    def prepare_target(self, target: Any, model_kwargs: dict, generation_config: Any, prompt_len: int,
                       width: int) -> None:
        """Before the target's prefill: sliding-window targets get a full-layer cache (cropped at any length)."""
        if self.compacts(target):
            model_kwargs[_compat.CACHE_KWARG] = _compat.new_dynamic_cache(target)

    def wrap_target(self, target: Any, cache: Any, mask: torch.Tensor | None, length: int, batch_size: int,
                    device: torch.device, positions: PositionRule) -> SlottedCache:
        """The target's cache as its prefill left it (``length`` slots, ``mask`` [B, length] or None)."""
        return self._opened(DynamicSlottedCache(cache, batch_size, device, positions, compact=self.compacts(target),
                                                length=length, mask=None if mask is None else mask.long(),
                                                linear=linear_states(target, cache, batch_size)))

    def new(self, model: Any, batch_size: int, device: torch.device, positions: PositionRule = ROPE_1D) -> SlottedCache:
        """An empty cache for a draft model (the drafters' :data:`~hf_specmm.caches.CacheFactory`)."""
        cache = _compat.new_dynamic_cache(model)
        return self._opened(DynamicSlottedCache(cache, batch_size, device, positions, compact=self.compacts(model),
                                                linear=linear_states(model, cache, batch_size)))



def compact_cache(cache: Any, mask: torch.Tensor | None, prompt_len: int, length: int) -> Any:
    """The loop's holed cache as plain generate returns it: per row the prompt's slots and its valid
    generated slots, ``length`` slots in all (rows that finished early are zero-padded)."""
    if mask is None or cache is None:
        return cache
    slots = torch.arange(mask.shape[1], device=mask.device)
    keep = (slots[None] < prompt_len) | mask.bool()
    order = torch.sort((~keep).long(), dim=1, stable=True).indices[:, :length]  # kept slots first, in order
    valid = keep.gather(1, order)

    def gather(states: torch.Tensor) -> torch.Tensor:  # [B, H, L, D] -> [B, H, length, D]
        index = order.to(states.device)[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1])
        return states.gather(2, index).masked_fill(~valid.to(states.device)[:, None, :, None], 0)

    return _compat.rebuild_dynamic_cache(cache, lambda keys, values: (gather(keys), gather(values)), length)
