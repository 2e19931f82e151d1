"""Rollback of linear-attention layers (Qwen3.5's Gated DeltaNet), for any model that has them, target or draft.

A linear-attention layer keeps no slot per token: a conv state (its last K inputs) and a recurrent state
summarise every token it has read. A rollback cannot crop them, and rows of a batch keep different numbers
of tokens. :class:`LinearStates` restores them exactly, by *snapshot and replay over the linear layers only*:

- the states at the last rollback are kept (the snapshot: the replay's own result, so no copy per round);
- during every forward over the cache, hooks keep each linear layer's ``in_proj_qkv`` / ``in_proj_a`` /
  ``in_proj_b`` outputs (references, no copy): everything the layer's state update reads;
- at a rollback, each layer replays its row's kept tokens from the snapshot with the model's own single-step
  kernel (the one plain ``generate``'s decode steps run), and the states are written back in place.

The alternative, the states of every block position captured during the verification forward, needs a kernel
of our own inside the model's forward (the chunked kernel only yields the state after the last token); the
other alternative, a second target forward over the kept tokens, costs a forward per round. Measured costs:
``docs/stateful-layers.md``.

A forward whose block has holes (a row with an invalid slot) would advance that row's states over the hole:
after such a forward each layer's states are recomputed at once over the valid slots only. The outputs of the
slots after a hole in that forward stay as the model computed them (drafts only: the loop's verification
blocks and the chain drafters' stateful reads have no holes).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _compat
from . import gated_delta
from ..hooks import this_call

_PROJECTIONS = ("in_proj_qkv", "in_proj_a", "in_proj_b")


class LinearStates:
    """The linear-attention states of one ``cache`` of ``model``, rolled back with the cache's slots.

    Driven by :class:`~hf_specmm.caches.base.SlottedCache`: :meth:`append` before each forward over the cache,
    :meth:`rollback` with the cache's, :meth:`select_rows`, and :meth:`close` at the end of the call (removes
    the hooks). Forwards over other caches of the same model (the target drafting for itself) are not captured.
    """

    def __init__(self, model: Any, cache: Any, batch_size: int):
        self.cache, self.batch_size = cache, batch_size
        self.modules = _compat.gated_delta_modules(model)
        # per layer: (conv, recurrent) at the last rollback, None before the layer's first forward (a prompt)
        self.snapshot: dict[int, tuple[torch.Tensor, torch.Tensor] | None] = {}
        self.captured: dict[int, dict[str, list[torch.Tensor]]] = {i: {p: [] for p in _PROJECTIONS}
                                                                   for i in self.modules}
        self.valid: list[torch.Tensor] = []  # [B, w] bool per forward since the last rollback
        self._reading: set[int] = set()  # layers in a forward over this cache now
        self._holes = False  # the current forward's block has holes
        for index in self.modules:  # the prefill already ran (target): its states are the first snapshot
            states = _compat.linear_states(cache, index)
            if states is not None:
                self.snapshot[index] = (states[0].clone(), states[1].clone())
        self._hooks = []
        for index, module in self.modules.items():
            self._hooks.append(module.register_forward_pre_hook(this_call(self._enter(index)), with_kwargs=True))
            self._hooks.append(module.register_forward_hook(this_call(self._leave(index))))
            for name in _PROJECTIONS:
                self._hooks.append(getattr(module, name).register_forward_hook(this_call(self._keep(index, name))))

    # ---- hooks -----------------------------------------------------------------------------------------
    def _enter(self, index: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            if kwargs.get(_compat.LINEAR_CACHE_KWARG) is not self.cache:
                return
            self._reading.add(index)
            if index not in self.snapshot:  # the layer's first forward (a prompt): stock semantics, no snapshot
                self.snapshot[index] = None
        return hook

    def _keep(self, index: int, name: str) -> Any:
        def hook(module: Any, args: tuple, output: torch.Tensor) -> None:
            if index in self._reading and self.snapshot.get(index) is not None:
                self.captured[index][name].append(output)
        return hook

    def _leave(self, index: int) -> Any:
        def hook(module: Any, args: tuple, output: Any) -> None:
            if index not in self._reading:
                return
            self._reading.discard(index)
            if self.snapshot.get(index) is None:  # after a prompt: its states are the first snapshot
                self.snapshot[index] = self._current(index)
            elif self._holes:  # the states advanced over holes: recompute them over the valid slots
                self._replay([index], self._kept(None, None))
        return hook

    def _current(self, index: Any) -> tuple[torch.Tensor, ...]:
        """A copy of layer ``index``'s states in the cache now."""
        return tuple(state.clone() for state in _compat.linear_states(self.cache, index))

    # ---- the slot operations -------------------------------------------------------------------------
    def append(self, valid: torch.Tensor | None, width: int, device: torch.device) -> None:
        """Before a forward over ``width`` new slots (``valid`` [B, width] bool or None = all)."""
        block = torch.ones(self.batch_size, width, dtype=torch.bool, device=device) if valid is None else valid.bool()
        self._holes = valid is not None and not bool(block.all())
        if self.snapshot:  # a prompt's slots (the first forward) are never rolled back: not recorded
            self.valid.append(block)

    def _kept(self, start: int | None, counts: torch.Tensor | None) -> torch.Tensor:
        """[B, slots since the last rollback] bool: the slots each row keeps (``start``: relative, the first
        slot rolled back; the first ``counts[b]`` slots from there are kept if valid)."""
        kept = torch.cat(self.valid, dim=1)
        if start is not None:
            tail = torch.arange(kept.shape[1] - start, device=kept.device)[None] < counts[:, None].to(kept.device)
            kept = torch.cat([kept[:, :start], kept[:, start:] & tail], dim=1)
        return kept

    def _replay(self, indices: list[int], kept: torch.Tensor) -> dict[int, tuple[torch.Tensor, ...]] | None:
        """Put ``indices``' states back at each row's ``kept`` slots since the snapshot (written in place)."""
        ready = [i for i in indices if self.snapshot.get(i) is not None and self.captured[i]["in_proj_qkv"]]
        if not ready:
            return
        inputs = [tuple(torch.cat(self.captured[i][name], dim=1) for name in _PROJECTIONS) for i in ready]
        keep = kept[:, -inputs[0][0].shape[1]:].to(inputs[0][0].device)
        states = gated_delta.replay([self.modules[i] for i in ready], [self.snapshot[i] for i in ready], inputs, keep)
        for index, (conv, recurrent) in zip(ready, states):
            _compat.write_linear_states(self.cache, index, conv, recurrent)
        return dict(zip(ready, states))

    def rollback(self, start: int, counts: torch.Tensor, length: int) -> None:
        """Keep the slots before ``start`` and the first ``counts[b]`` after it, of a cache ``length`` slots
        long: replay each row's kept tokens from the snapshot (the state at the last rollback)."""
        recorded = sum(block.shape[1] for block in self.valid)
        since = length - recorded  # the cache's length at the last rollback
        if start < since:
            raise RuntimeError(f"a linear-attention layer cannot be rolled back to slot {start}: its states were "
                               f"last kept at slot {since}")
        if recorded:
            self.snapshot.update(self._replay(list(self.modules), self._kept(start - since, counts)) or {})
        self._clear()

    def _clear(self) -> None:
        self.valid = []
        for parts in self.captured.values():
            for captured in parts.values():
                captured.clear()

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep rows ``keep`` of the snapshot (the cache's own states are selected by the backend)."""
        self._clear()
        for index, states in self.snapshot.items():
            if states is not None:
                self.snapshot[index] = tuple(s[keep.to(s.device)] for s in states)
        self.batch_size = int(keep.numel())

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def linear_states(model: Any, cache: Any, batch_size: int) -> LinearStates | None:
    """The rollback of ``model``'s linear-attention layers over ``cache`` (None for an attention-only model)."""
    return LinearStates(model, cache, batch_size) if _compat.stateful_layer_types(model.config) else None
