"""The static backend: transformers' ``StaticCache`` and a fixed-width slot mask, so a compiled forward
(CUDA graphs on GPU, inductor on CPU) is traced once per (batch size, block width) and replayed every round.

Same slot model as every :class:`~hf_specmm.caches.base.SlottedCache` (rows share physical slots; rejected
drafts of shorter rows stay as masked holes; a token's position is the number of valid slots before it),
with every shape fixed for a whole ``generate`` call:

- the KV cache is a ``StaticCache`` of ``capacity`` slots, built as stock ``generate`` builds it;
- the slot mask is one preallocated ``[B, capacity]`` buffer written in place; every forward gets the whole
  buffer as its ``attention_mask`` (unwritten slots are 0, and the causal mask hides them anyway);
- rollback moves the layers' write pointer back and zeroes the rejected slots' bits: no crop, no copy;
- when a block would run past ``capacity`` (holes of many rounds), holes are moved to the left of every row
  and the slots that are holes in every row are given back: one in-place gather, rare;
- finished rows stay in the batch, masked (a new batch size would be a new graph).

Sliding-window models (Gemma 3): ``StaticCache``'s sliding layers are rolling buffers that drop older states
for good, so a rollback or a hole cannot be undone there. Here every layer is a full-length layer and each
forward gets 4-D masks, one per layer type (:class:`WindowMasks`), whose window is counted in *positions*:
a token attends to the valid slots whose position is within ``sliding_window`` of its own. For a left-padded
prompt (the loop requires one for sliding models) that is the window plain ``generate`` applies, holes or not,
so no slot is ever moved for it.

Linear-attention layers (Qwen3.5) keep fixed-size states, written in place by their rollback
(:mod:`hf_specmm.caches.linear`); their forwards get the same per-layer-type masks (none for the linear
layers, which would read the whole buffer's last columns as the block's padding) and run eagerly.

Inkling's hybrid layers (short convolutions beside attention) are kept as full-length static hybrid layers, their
conv states written in place by their rollback (:mod:`hf_specmm.caches.short_conv`); the convolutions get the
block's own slot mask as their padding mask. Its relative position bias reads cache columns, not positions, so
these caches move every row's holes to its left end after each rollback (``compact``, as dynamic caches do), and
the cache is a :class:`~hf_specmm._compat.ColumnStaticCache`, whose query column is read before the write.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _compat
from ..targets.positions import ROPE_1D, PositionRule
from .base import Backend, SlottedCache
from .linear import LinearStates
from .short_conv import linear_states  # every stateful kind (linear attention, short convolutions)


class WindowMasks:
    """4-D masks for a full-layer cache of a sliding-window model, the window counted in positions (``cumsum``
    of the slot mask): one per layer type where layers differ (Gemma 3), through the same argument layout as
    draft trees (``_compat.mask_argument``). Built for the ``sdpa`` (bool masks) and ``eager``
    (additive float masks) attention implementations, the two that take a materialised 4-D mask as is."""

    IMPLEMENTATIONS = ("sdpa", "eager")

    def __init__(self, config: Any, dtype: torch.dtype):
        self.config, self.dtype = config, dtype
        self.short_convs = _compat.has_short_convs(config)
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

        # Inkling's short convolutions zero their inputs at the block's invalid slots, as a dynamic cache's 2-D mask
        # makes them do (a whole-buffer mask's last columns would read as the block's)
        block = buffer[:, start : start + width] if self.short_convs else None
        return _compat.mask_argument(self.config, make_mask, block)


def compacts(model: Any) -> bool:
    """Whether ``model``'s caches move holes left after each rollback: it reads distances between tokens off cache
    columns (Inkling's relative position bias), where a hole would count as a token."""
    return _compat.distances_by_column(model.config)


def needs_4d_masks(model: Any) -> bool:
    """Whether forwards over a static cache of ``model`` take :class:`WindowMasks`' per-layer-type masks: a window
    counted in positions, or linear-attention layers, which read the last block-width columns of a 2-D mask as the
    block's padding (the whole-buffer mask's unwritten columns, here)."""
    return _compat.has_sliding_layers(model.config) or bool(_compat.stateful_layer_types(model.config))


class StaticSlottedCache(SlottedCache):
    """A :class:`SlottedCache` over a (full-layer) ``StaticCache`` of ``capacity`` slots.

    Example::

        >>> import torch
        >>> from hf_specmm import _compat, testing
        >>> model = testing.tiny_target("llava")
        >>> kv = StaticSlottedCache.for_model(model, batch_size=1, capacity=16, device=torch.device("cpu"))
        >>> inputs = kv.append(None, 4)
        >>> out = model(input_ids=torch.tensor([[1, 5, 6, 7]]), **kv.forward_kwargs(), **inputs, use_cache=True)
        >>> kv.rollback(0, torch.tensor([3]))  # keep three of the four: the write pointer is back at slot 3
        >>> kv.length, inputs["attention_mask"].shape
        (3, torch.Size([1, 16]))
    """

    def __init__(self, cache: Any, batch_size: int, device: torch.device, positions: PositionRule = ROPE_1D,
                 length: int = 0, mask: torch.Tensor | None = None, window_masks: WindowMasks | None = None,
                 linear: LinearStates | None = None, compact: bool = False):
        super().__init__(cache, batch_size, device, positions, compact=compact, length=length, linear=linear)
        self.capacity = _compat.static_capacity(cache)
        if length > self.capacity:
            raise ValueError(f"the prompt takes {length} slots but the static cache holds {self.capacity}: "
                             "raise generation_config.max_cache_len")
        self.window_masks = window_masks
        self._buffer = torch.zeros(batch_size, self.capacity, dtype=torch.long, device=device)
        self._buffer[:, :length] = 1 if mask is None else mask.long()
        torch._dynamo.mark_static_address(self._buffer)  # one address for the whole call: no CUDA-graph input copy

    @classmethod
    def for_model(cls, model: Any, batch_size: int, capacity: int, device: torch.device,
                  positions: PositionRule = ROPE_1D) -> "StaticSlottedCache":
        """An empty cache of ``capacity`` slots for ``model`` (sliding layers as full layers + window masks)."""
        sliding = _compat.has_sliding_layers(model.config)
        cache = _compat.new_static_cache(model, capacity, full_layers=sliding)
        windows = WindowMasks(model.config, model.dtype) if needs_4d_masks(model) else None
        return cls(cache, batch_size, device, positions, window_masks=windows,
                   linear=linear_states(model, cache, batch_size), compact=compacts(model))

    @classmethod
    def from_prefill(cls, model: Any, inputs: dict[str, Any], capacity: int, positions: PositionRule) -> "StaticSlottedCache":
        """Run the prompt ``inputs`` (images included) through ``model`` into a new cache of ``capacity`` slots,
        with the positions plain ``generate`` gives a left-padded prompt (``positions`` bound to it)."""
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask.long()
        kv = cls.for_model(model, ids.shape[0], capacity, ids.device, positions)
        written = kv.append(mask.bool(), ids.shape[1], positions.prompt_positions(mask))
        model(**{**inputs, **written}, **kv.forward_kwargs(), use_cache=True)
        return kv

    def forward_kwargs(self) -> dict[str, Any]:
        return _compat.cache_kwargs(self.cache)

    def _reserve(self, width: int) -> torch.Tensor:
        if self.length + width > self.capacity:
            self._make_room(width)
        return self._buffer

    def next_positions(self) -> torch.Tensor:
        return self._buffer.sum(-1)  # slots past ``length`` are always 0

    def append(self, valid: torch.Tensor | None, width: int,
               position_ids: torch.Tensor | None = None) -> dict[str, Any]:
        """As :meth:`SlottedCache.append`, with the same shapes every round for a fixed ``width``: the mask is
        the whole ``[B, capacity]`` buffer (or the per-layer-type 4-D masks of a sliding-window model)."""
        self._reserve(width)
        start = self.length
        inputs = super().append(valid, width, position_ids)
        if start == 0:  # a prompt (no holes yet): the model builds its own masks, as plain generate's prefill
            inputs["attention_mask"] = self.mask  # (Gemma 3: bidirectional attention within each image)
        elif self.window_masks is not None:
            inputs["attention_mask"] = self.window_masks(self._buffer, start, width)
        else:
            inputs["attention_mask"] = self._buffer
        return inputs

    def _keep_prefix(self, length: int) -> None:
        _compat.set_static_length(self.cache, length)

    def _select_storage(self, keep: torch.Tensor) -> None:
        _compat.select_static_rows(self.cache, keep)

    def select_rows(self, keep: torch.Tensor) -> None:
        """Reallocates at the new batch size (a compiled forward compiles once more): the loop keeps finished
        rows in place on a static cache instead (``StaticBackend.drops_rows`` is False)."""
        super().select_rows(keep)
        self._buffer = self._buffer.contiguous()
        torch._dynamo.mark_static_address(self._buffer)

    def _gather_slots(self, start: int, index: torch.Tensor) -> None:
        _compat.gather_cache_slots(self.cache, start, index)

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
        _compat.gather_cache_slots(self.cache, 0, order[:, shift:])
        self._buffer[:, :kept] = ordered[:, shift:]
        self._buffer[:, kept:] = 0
        self.length = kept
        _compat.set_static_length(self.cache, kept)


class StaticBackend(Backend):
    """``cache_implementation="static"``: static caches for the target and the draft, sized once per call, and
    the compiled forward stock ``generate`` would use (``generation_config.compile_config``, ``disable_compile``,
    stock's own criteria: on CPU only with ``compile_config._compile_all_devices``). Finished rows stay in
    the batch, masked, so no cache is reallocated and every round has the same shapes."""

    name = "static"
    drops_rows = False

    def __init__(self) -> None:
        super().__init__()
        self.capacity = self.draft_capacity = 0
        self.compile_config: Any = None  # set when the call decodes with compiled forwards

    @staticmethod
    def requires_left_padding(model: Any) -> bool:
        """Windows are counted in positions from the left end of each row (see :class:`WindowMasks`), and a model
        that reads distances off cache columns reads them from each row's right end."""
        return _compat.has_sliding_layers(model.config) or compacts(model)

    def prepare_target(self, target: Any, model_kwargs: dict, generation_config: Any, prompt_len: int,
                       width: int) -> None:
        """Before the prefill: a static cache with room for ``max_length`` tokens plus a block of ``width``
        (drafts run past a row's last kept token), full layers for sliding-window models; whether this call
        compiles, by stock's criteria. A draft's cache also keeps, per round, one pending slot of each row
        that has finished (its rows stay in place), so it gets room for ``max_new_tokens`` more."""
        self.capacity = _compat.static_cache_length(target, generation_config.max_length + width, generation_config)
        self.draft_capacity = self.capacity + generation_config.max_length - prompt_len + width
        sliding = _compat.has_sliding_layers(target.config)
        model_kwargs[_compat.CACHE_KWARG] = _compat.new_static_cache(target, self.capacity, full_layers=sliding)
        if _compat.compile_requested(target, model_kwargs, generation_config):
            self.compile_config = generation_config.compile_config

    def wrap_target(self, target: Any, cache: Any, mask: torch.Tensor | None, length: int, batch_size: int,
                    device: torch.device, positions: PositionRule) -> SlottedCache:
        windows = WindowMasks(target.config, target.dtype) if needs_4d_masks(target) else None
        kv = StaticSlottedCache(cache, batch_size, device, positions, length, mask, windows,
                                linear_states(target, cache, batch_size), compacts(target))
        kv.compile_config = self.compile_config
        return self._opened(kv)

    def new(self, model: Any, batch_size: int, device: torch.device, positions: PositionRule = ROPE_1D) -> SlottedCache:
        kv = StaticSlottedCache.for_model(model, batch_size, self.draft_capacity, device, positions)
        kv.compile_config = self.compile_config
        return self._opened(kv)
