"""The static backend of the loop's slotted caches: a preallocated ``StaticCache`` and a fixed-width slot mask.

Same slot model as the dynamic ``SlottedCache`` (rows share physical slots; rejected drafts of shorter rows
stay as masked holes; a token's position is the number of valid slots before it), with every shape fixed
for a whole ``generate`` call, so a compiled forward (CUDA graphs on GPU, inductor on CPU) is traced once
and replayed every round:

- the KV cache is transformers' ``StaticCache``, built as stock ``generate`` builds it, ``capacity`` slots;
- the slot mask is one preallocated ``[B, capacity]`` buffer, written in place; every forward gets the
  whole buffer as its ``attention_mask`` (unwritten slots are 0, and the causal mask hides them anyway);
- rollback moves the layers' write pointer back and zeroes the rejected slots' bits: no crop, no copy;
- when a block would run past ``capacity`` (holes of many rounds), holes are moved to the left of every
  row and the slots that are holes in every row are given back: one in-place gather, rare.

Sliding-window models (Gemma 3): ``StaticCache``'s sliding layers are rolling buffers of ``sliding_window``
slots that drop older states for good, so a rollback or a hole cannot be undone there. Sliding layers are
full-length layers here, and each forward gets 4-D masks, one per layer type (Gemma 3 accepts that mapping),
whose window is counted in *positions*, not physical slots: a token attends to the valid slots whose
position is within ``sliding_window`` of its own. For a left-padded prompt (the loop requires one for
sliding models) that is the window plain ``generate`` applies, holes or not, and no slot is moved.

Example::

    >>> from hf_specmm import _compat, testing
    >>> model = testing.tiny_target("llava")
    >>> ids = torch.tensor([[1, 5, 6, 7]])
    >>> cache = _compat.new_static_cache(model, max_cache_len=16)
    >>> out = model(input_ids=ids, **_compat.cache_kwargs(cache), use_cache=True)
    >>> kv = StaticSlottedCache(cache, None, 4, 1, ids.device)
    >>> inputs = kv.block_inputs(None, 2)
    >>> out = model(input_ids=torch.tensor([[8, 9]]), **kv.forward_kwargs(), **inputs, use_cache=True)
    >>> kv.commit(inputs["attention_mask"], 2)
    >>> kv.rollback(4, torch.tensor([[True]]))  # keep one of the two: the write pointer is back at slot 5
    >>> kv.length, inputs["attention_mask"].shape
    (5, torch.Size([1, 16]))
"""

from __future__ import annotations

from typing import Any

import torch

from . import _compat
from .targets.positions import ROPE_1D, Rope1D


class WindowMasks:
    """4-D masks for a full-layer cache of a sliding-window model, the window counted in positions (``cumsum``
    of the slot mask): one per layer type where layers differ (Gemma 3), through the same argument layout as
    draft trees (``_compat.tree_attention_argument``). Built for the ``sdpa`` (bool masks) and ``eager``
    (additive float masks) attention implementations, the two that take a materialised 4-D mask as is."""

    IMPLEMENTATIONS = ("sdpa", "eager")

    def __init__(self, config: Any, dtype: torch.dtype):
        self.config, self.dtype = config, dtype
        self.implementation = getattr(config, "_attn_implementation", None) or "sdpa"
        if self.implementation not in self.IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation={self.implementation!r} with a static cache on a sliding-window "
                             f"model: load the model with one of {self.IMPLEMENTATIONS}, or leave "
                             "cache_implementation unset")

    def __call__(self, buffer: torch.Tensor, start: int, width: int) -> Any:
        """Masks [B, 1, width, capacity] of the ``width`` query slots from ``start`` over the whole buffer."""
        valid = buffer.bool()
        positions = buffer.cumsum(-1) - 1  # a hole repeats the previous valid slot's position (never attended)
        slots = torch.arange(buffer.shape[1], device=buffer.device)
        causal = slots[None, :] <= slots[start : start + width, None]  # [width, capacity]
        full = valid[:, None, :] & causal[None]  # [B, width, capacity]
        distance = positions[:, start : start + width, None] - positions[:, None, :]

        def make_mask(window: int | None) -> torch.Tensor:
            mask = (full if window is None else full & (distance < window))[:, None]
            if self.implementation == "eager":
                low = torch.finfo(self.dtype).min
                return torch.zeros((), dtype=self.dtype, device=buffer.device).masked_fill(~mask, low)
            return mask

        return _compat.tree_attention_argument(self.config, make_mask)


class StaticSlottedCache:
    """One model's ``StaticCache`` for one ``generate`` call, its fixed-width slot mask and its position rule.

    Args:
        cache: a (full-layer) ``StaticCache``: ``_compat.new_static_cache``, or :meth:`for_model`.
        mask: [B, length] slot mask of what the cache already holds (a prefill's prompt mask), or None: all valid.
        length: slots already written (the write pointer of every layer).
        batch_size, device: rows in the cache; where the mask and positions live.
        positions: the model's position rule, bound to the call's prompt where it needs to be.
        window_masks: for sliding-window models, the per-layer-type masks (:class:`WindowMasks`).

    Interface (as the dynamic ``SlottedCache``): :meth:`block_inputs` then the forward then :meth:`commit`
    (or :meth:`append`, both at once); :meth:`rollback`; :meth:`select_rows`; :attr:`mask`; :attr:`length`.
    """

    def __init__(self, cache: Any, mask: torch.Tensor | None, length: int, batch_size: int, device: torch.device,
                 positions: Rope1D = ROPE_1D, window_masks: WindowMasks | None = None):
        self.cache = cache
        self.capacity = _compat.static_capacity(cache)
        if length > self.capacity:
            raise ValueError(f"the prompt takes {length} slots but the static cache holds {self.capacity}: "
                             "raise generation_config.max_cache_len")
        self.length, self.batch_size, self.device = length, batch_size, device
        self.positions = positions
        self.window_masks = window_masks
        self._buffer = torch.zeros(batch_size, self.capacity, dtype=torch.long, device=device)
        self._buffer[:, :length] = 1 if mask is None else mask.long()
        torch._dynamo.mark_static_address(self._buffer)  # one address for the whole call: no CUDA-graph input copy

    @classmethod
    def for_model(cls, model: Any, batch_size: int, capacity: int, device: torch.device,
                  positions: Rope1D = ROPE_1D) -> StaticSlottedCache:
        """An empty cache of ``capacity`` slots for ``model`` (sliding layers as full layers + window masks)."""
        sliding = _compat.has_sliding_layers(model.config)
        cache = _compat.new_static_cache(model, capacity, full_layers=sliding)
        windows = WindowMasks(model.config, model.dtype) if sliding else None
        return cls(cache, None, 0, batch_size, device, positions, windows)

    @classmethod
    def prefill(cls, model: Any, inputs: dict[str, Any], capacity: int, positions: Rope1D) -> StaticSlottedCache:
        """Run the prompt ``inputs`` (images included) through ``model`` into a new cache of ``capacity`` slots,
        with the positions plain ``generate`` gives a left-padded prompt (``positions`` bound to it)."""
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask.long()
        kv = cls.for_model(model, ids.shape[0], capacity, ids.device, positions)
        model(**inputs, position_ids=positions.prompt_positions(mask), **kv.forward_kwargs(), use_cache=True)
        kv._buffer[:, : ids.shape[1]] = mask
        kv.length = ids.shape[1]
        return kv

    # ---- what a forward over this cache passes -------------------------------------------------------
    def forward_kwargs(self) -> dict[str, Any]:
        return _compat.cache_kwargs(self.cache)

    @property
    def mask(self) -> torch.Tensor:
        """[B, length] long: which written slots are valid (a view of the buffer)."""
        return self._buffer[:, : self.length]

    def next_positions(self) -> torch.Tensor:
        """[B] valid slots per row: the position count of each row's next token."""
        return self._buffer.sum(-1)  # slots past ``length`` are always 0

    def block_inputs(self, valid: torch.Tensor | None, width: int) -> dict[str, Any]:
        """Stage ``width`` new slots (``valid`` [B, width] or None = all) at the write pointer and return the
        forward's ``attention_mask`` (the whole [B, capacity] buffer, or the per-layer-type 4-D masks of a
        sliding-window model) and ``position_ids``. Same shapes every round for a fixed ``width``."""
        if self.length + width > self.capacity:
            self._make_room(width)
        positions = self.positions.block_positions(self.next_positions(), valid, width)
        block = self._buffer[:, self.length : self.length + width]
        block.copy_(valid.long() if valid is not None else torch.ones_like(block))
        if self.window_masks is not None:
            return {"attention_mask": self.window_masks(self._buffer, self.length, width), "position_ids": positions}
        return {"attention_mask": self._buffer, "position_ids": positions}

    def commit(self, attention_mask: Any, width: int) -> None:
        """Record that the forward wrote the ``width`` slots :meth:`block_inputs` staged (the layers moved their
        own write pointers; ``attention_mask`` is the staged buffer itself, nothing to copy)."""
        self.length += width

    def append(self, valid: torch.Tensor | None, width: int,
               position_ids: torch.Tensor | None = None) -> dict[str, Any]:
        """:meth:`block_inputs` and :meth:`commit` at once (``position_ids``: given, e.g. a prompt's)."""
        inputs = self.block_inputs(valid, width)
        if position_ids is not None:
            inputs["position_ids"] = position_ids
        self.commit(inputs["attention_mask"], width)
        return inputs

    def rollback(self, keep_from: int, valid: torch.Tensor) -> None:
        """Keep slots ``[0, keep_from + k)``; ``valid`` [B, k] bool marks which of the last k stay valid (or
        ``valid`` [B] counts: the first ``valid[b]`` of them). The write pointer moves back; later slots are
        zeroed in the mask and overwritten by the next block."""
        if valid.dim() == 1:
            valid = torch.arange(int(valid.max()) if valid.numel() else 0, device=valid.device)[None] < valid[:, None]
        new_length = keep_from + valid.shape[1]
        self._buffer[:, keep_from:new_length] = valid.to(self._buffer.device).long()
        self._buffer[:, new_length : self.length] = 0
        self.length = new_length
        _compat.set_static_length(self.cache, new_length)

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` [k]. The cache is reallocated at the new batch size (a compiled forward
        compiles once more), so a loop on a static cache keeps finished rows in place, masked, instead."""
        _compat.select_static_rows(self.cache, keep)
        self._buffer = self._buffer[keep.to(self.device)].contiguous()
        torch._dynamo.mark_static_address(self._buffer)
        self.positions = self.positions.select(keep)
        self.batch_size = int(keep.numel())

    def _make_room(self, width: int) -> None:
        """Move every row's holes to its left end (stable: valid slots keep their order, so positions and
        windows are unchanged) and give back the slots that are holes in every row."""
        written = self._buffer[:, : self.length]
        ordered, order = torch.sort(written, dim=1, stable=True)
        shift = int((written == 0).sum(-1).min())
        kept = self.length - shift
        if kept + width > self.capacity:
            raise ValueError(f"a block of {width} slots does not fit the static cache ({self.capacity} slots, "
                             f"{kept} in use after compaction): raise generation_config.max_cache_len")
        _compat.permute_static_slots(self.cache, order[:, shift:])
        self._buffer[:, :kept] = ordered[:, shift:]
        self._buffer[:, kept:] = 0
        self.length = kept
        _compat.set_static_length(self.cache, kept)
