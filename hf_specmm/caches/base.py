"""The cache interface of the speculative loop: a model's KV cache plus the 2-D mask of its physical slots.

Rows of a batch accept different numbers of drafted tokens per round. Instead of shifting each row's
cache (a copy of the whole cache per round), the rejected slots of the shorter rows stay in place as
*holes* (mask 0): rows share physical slot indices, and rollback keeps a prefix of slots, never a
re-prefill. A token's rotary position is the number of valid slots before it (the bound position rule
does the numbering), which is exactly how plain ``generate`` numbers left-padded prompts
(``cumsum(mask) - 1``); positions are passed explicitly, never implied by the cache's length.

Sliding-window models (Gemma 3) are the exception: their window counts physical slots, so a hole would
push a token out of a row's window that plain generate keeps in it. Their caches are kept with full
layers (the mask applies the window) and ``compact=True`` moves each row's holes to its left end after
every rollback (one gather per round with holes): every row is then a left-padded sequence again, and
its window covers exactly the tokens plain generate's does.

A backend (``dynamic.py``; the static backend plugs in the same way) implements the storage operations:
keep a prefix of slots, select rows, permute or gather slots. The mask, the positions and the rollback
rules live here, once, for every backend and every model (target and drafts alike).

Linear-attention layers (Qwen3.5's Gated DeltaNet) keep states, not slots: a cache of a model that has them
carries a :class:`~hf_specmm.caches.linear.LinearStates` (``linear``), told of every append, rollback and row
selection, which puts those states back exactly where each row's kept slots end.

Seams for draft trees: :meth:`SlottedCache.append` takes per-slot ``valid`` flags and explicit
``position_ids``, and :meth:`SlottedCache.rollback` takes a ``path`` (which block slots to keep, in order),
so a tree block is written and then compacted to its accepted path in place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import torch

from .. import _compat
from ..targets.positions import ROPE_1D, PositionRule
from .linear import LinearStates


class SlottedCache(ABC):
    """One model's KV cache for one ``generate`` call, with the slot mask and the position rule.

    Args:
        cache: the transformers cache object the model's forward reads and writes.
        batch_size: rows in the cache.
        device: where the mask and positions live (the loop's device).
        positions: the model's position rule, bound to the call's prompt where it needs to be.
        compact: move holes to the left after each rollback (sliding-window models).
        length: slots already written (the prefill's, when the cache comes from a prefill).
        mask: [B, length] slot mask of what is already written, or None when every slot is valid.
        linear: the states of the model's linear-attention layers (None: it has none).
    """

    def __init__(self, cache: Any, batch_size: int, device: torch.device, positions: PositionRule = ROPE_1D,
                 compact: bool = False, length: int = 0, mask: torch.Tensor | None = None,
                 linear: LinearStates | None = None):
        self.cache = cache
        self.linear = linear
        self.batch_size, self.device = batch_size, device
        self.positions = positions
        self.compact = compact
        self.length = length
        # [B, capacity] long, grown by doubling (never by a concatenation per round); None while every
        # written slot is valid (no padding, no holes): the model then gets no mask at all
        self._buffer: torch.Tensor | None = None
        if mask is not None:
            self._reserve(0)
            self._buffer[:, :length] = mask.long()

    #: how fixed-width forwards over this cache run: ``None`` eagerly, else stock's compiled forward with this
    #: ``CompileConfig`` (set by a backend whose shapes stay fixed, see :meth:`step_call`)
    compile_config: Any = None

    def step_call(self, model: Any) -> Callable[..., Any]:
        """The callable for a fixed-width forward of ``model`` over this cache (a prefill calls ``model``). Eager
        where linear-attention states are captured (a compiled graph does not run hooks added after tracing)."""
        if self.compile_config is None or self.linear is not None:
            return model
        return _compat.compiled_call(model, self.compile_config)

    # ---- storage operations, one per backend ---------------------------------------------------------
    @abstractmethod
    def forward_kwargs(self) -> dict[str, Any]:
        """What a forward over this cache passes for it (the cache under this transformers' keyword)."""

    @abstractmethod
    def _keep_prefix(self, length: int) -> None:
        """Keep the first ``length`` physical slots of every row."""

    @abstractmethod
    def _select_storage(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` [k] of the storage."""

    @abstractmethod
    def _gather_slots(self, start: int, index: torch.Tensor) -> None:
        """Per row, slot ``start + j`` becomes old slot ``start + index[b, j]`` ([B, k])."""

    # ---- the slot mask -------------------------------------------------------------------------------
    @property
    def mask(self) -> torch.Tensor | None:
        """[B, length] long: which written slots are valid (None: all of them)."""
        return None if self._buffer is None else self._buffer[:, : self.length]

    def _reserve(self, width: int) -> torch.Tensor:
        """The mask buffer with room for ``width`` more slots (materialised as all-valid on first use)."""
        need = self.length + width
        if self._buffer is None or self._buffer.shape[1] < need:
            grown = torch.zeros(self.batch_size, max(2 * need, 64), dtype=torch.long, device=self.device)
            if self._buffer is None:
                grown[:, : self.length] = 1
            else:
                grown[:, : self.length] = self._buffer[:, : self.length]
            self._buffer = grown
        return self._buffer

    def reserve(self, width: int) -> None:
        """Make room for ``width`` more slots now (a static backend may compact, moving slots), so that the
        slot indices a caller records before its next appends stay valid until its rollback."""
        self._reserve(width)

    def next_positions(self) -> torch.Tensor:
        """[B] how many valid slots each row has: the position count of its next token."""
        if self._buffer is None:
            return torch.full((self.batch_size,), self.length, dtype=torch.long, device=self.device)
        return self.mask.sum(-1)

    def append(self, valid: torch.Tensor | None, width: int,
               position_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor | None]:
        """Record ``width`` new slots (``valid`` [B, width] bool, None = all valid) and return the
        ``attention_mask`` and ``position_ids`` of the forward that writes them (``position_ids``:
        given, e.g. a prompt's M-RoPE grid positions, else the position rule's block positions)."""
        if position_ids is None:
            position_ids = self.positions.block_positions(self.next_positions(), valid, width)
        if self.linear is not None:
            self.linear.append(valid, width, self.device)
        if valid is None and self._buffer is None:
            self.length += width
            return {"attention_mask": None, "position_ids": position_ids}
        buffer = self._reserve(width)
        block = buffer[:, self.length : self.length + width]
        block.copy_(valid.long() if valid is not None else torch.ones_like(block))
        self.length += width
        return {"attention_mask": self.mask, "position_ids": position_ids}

    def rollback(self, start: int, counts: torch.Tensor, path: torch.Tensor | None = None) -> None:
        """Keep slots ``[0, start)`` and, per row, the first ``counts[b]`` slots after ``start``, each only
        if it was valid (``counts`` [B]); later slots are dropped. ``path`` [B, k] (trees): the block
        slots to keep, in order (``start + path[b, j]`` moves to ``start + j``); None keeps a prefix."""
        width = int(counts.max()) if counts.numel() else 0
        if self.linear is not None:
            if path is not None:
                raise NotImplementedError("a draft tree's nodes need per-node linear-attention states")
            self.linear.rollback(start, counts, self.length)
        if path is not None:
            self._gather_slots(start, path[:, :width])
            if self._buffer is not None:
                block = self._buffer[:, start : self.length]
                self._buffer[:, start : start + width] = block.gather(1, path[:, :width].to(block.device))
        new_length = start + width
        self._keep_prefix(new_length)
        keep = torch.arange(width, device=counts.device)[None] < counts[:, None]  # [B, width]
        if self._buffer is None and bool(keep.all()):
            self.length = new_length
            return
        buffer = self._reserve(0)
        buffer[:, start:new_length] *= keep.to(buffer.device)
        buffer[:, new_length : self.length] = 0  # a dropped slot is a hole if a backend keeps it in place
        self.length = new_length
        if self.compact and not bool(buffer[:, start:new_length].all()):
            # stable sort: holes first, each row's valid slots keep their order
            mask, order = torch.sort(self.mask, dim=1, stable=True)
            buffer[:, :new_length] = mask
            self._gather_slots(0, order)

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` [k] (finished rows leave the batch: later forwards skip them)."""
        self._select_storage(keep)
        if self.linear is not None:
            self.linear.select_rows(keep)
        if self._buffer is not None:
            self._buffer = self._buffer[keep.to(self._buffer.device)]
        self.positions = self.positions.select(keep)
        self.batch_size = int(keep.numel())

    def close(self) -> None:
        """The call is over: stop capturing linear-attention inputs (the model's hooks are removed)."""
        if self.linear is not None:
            self.linear.close()

    def row_slots(self, row: int, last: int, always: int = 0) -> torch.Tensor:
        """Indices of row ``row``'s valid slots up to ``last`` (inclusive); the first ``always`` slots count
        as valid whatever the mask says (a prompt's padding, which plain generate's outputs show)."""
        slots = torch.arange(last + 1, device=self.device)
        if self._buffer is None:
            return slots
        return slots[(slots < always) | self._buffer[row, : last + 1].bool()]


class Backend:
    """What every cache backend shares: the caches it made whose linear-attention inputs are captured (hooks on
    the models) until :meth:`close`, which the loop calls when the ``generate`` call ends."""

    def __init__(self) -> None:
        self.opened: list[SlottedCache] = []

    def _opened(self, kv: SlottedCache) -> SlottedCache:
        if kv.linear is not None:
            self.opened.append(kv)
        return kv

    def close(self) -> None:
        for kv in self.opened:
            kv.close()
        self.opened = []


def mask_to(mask: Any, device: torch.device) -> Any:
    """An ``attention_mask`` from :meth:`SlottedCache.append` on ``device``: None, a tensor, or a dict of
    per-layer-type 4-D masks (sliding-window models on a static cache)."""
    if isinstance(mask, dict):
        return {name: None if m is None else m.to(device) for name, m in mask.items()}
    return None if mask is None else mask.to(device)


#: makes a draft's empty cache: ``(model, batch_size, device, positions) -> SlottedCache``
CacheFactory = Callable[[Any, int, torch.device, PositionRule], SlottedCache]
