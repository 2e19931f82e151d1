"""Rollback of short convolutions beside attention (Inkling's hybrid layers), for any model that has them.

An Inkling layer convolves its attention keys, its values, its attention output and its MLP output, each with a
causal depthwise convolution of kernel K (no bias, no activation) whose cache state is the last K inputs. A
rollback to a row's kept tokens is therefore a window, not a replay: the state after a row's last kept token is
the last K inputs of ``[state at the last rollback | the kept tokens' inputs]``. :class:`ShortConvStates` keeps
the state at the last rollback (the snapshot), captures every forward's convolution inputs over its cache
(references, no copy) and writes the window back in place at each rollback. The keys and values themselves are
slots, rolled back with the cache's. Slot bookkeeping (holes, rows leaving, the snapshot after a prompt) is
:class:`~hf_specmm.caches.linear.LinearStates`'.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _compat
from ..hooks import this_call
from . import linear
from .linear import LinearStates

_INPUT = "input"


class ShortConvStates(LinearStates):
    """The conv states of one ``cache`` of ``model``'s short convolutions, rolled back with the cache's slots
    (keyed ``(layer index, conv index)``)."""

    def __init__(self, model: Any, cache: Any, batch_size: int):
        self.cache, self.batch_size = cache, batch_size
        self.modules = _compat.short_conv_modules(model)
        self.snapshot: dict[Any, tuple[torch.Tensor] | None] = {}
        self.captured = {key: {_INPUT: []} for key in self.modules}
        self.valid: list[torch.Tensor] = []
        self._reading: set[Any] = set()
        self._holes = False
        for key in self.modules:  # the prefill already ran (target): its states are the first snapshot
            state = _compat.conv_state(cache, *key)
            if state is not None:
                self.snapshot[key] = (state.clone(),)
        self._hooks = []
        for key, module in self.modules.items():
            self._hooks.append(module.register_forward_pre_hook(this_call(self._read(key)), with_kwargs=True))
            self._hooks.append(module.register_forward_hook(this_call(self._leave(key))))

    def _read(self, key: Any) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            cache = next((kwargs[k] for k in _compat.SHORT_CONV_CACHE_KWARGS if k in kwargs), None)
            if cache is not self.cache:
                return
            self._reading.add(key)
            if key not in self.snapshot:  # the layer's first forward (a prompt): stock semantics, no snapshot
                self.snapshot[key] = None
            elif self.snapshot[key] is not None:
                inputs = args[0] if args else kwargs["hidden_states"]
                self.captured[key][_INPUT].append(inputs)
        return hook

    def _current(self, key: Any) -> tuple[torch.Tensor]:
        return (_compat.conv_state(self.cache, *key).clone(),)

    def _replay(self, keys: list[Any], kept: torch.Tensor) -> dict[Any, tuple[torch.Tensor]] | None:
        """Put ``keys``' states back at each row's ``kept`` slots since the snapshot (written in place)."""
        ready = [k for k in keys if self.snapshot.get(k) is not None and self.captured[k][_INPUT]]
        if not ready:
            return None
        out = {}
        for key in ready:
            (state,) = self.snapshot[key]
            inputs = torch.cat(self.captured[key][_INPUT], dim=1)  # [B, W, C]
            keep = kept[:, -inputs.shape[1]:].to(inputs.device)
            out[key] = (conv_window(state, inputs, keep),)
            _compat.write_conv_state(self.cache, *key, out[key][0])
        return out


def conv_window(state: torch.Tensor, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The state [B, C, K] of a short convolution after each row's ``keep`` [B, W] tokens of ``inputs`` [B, W, C],
    from ``state`` (before them): the last K of the row's kept inputs, in order, after the state's."""
    kernel = state.shape[-1]
    order = torch.sort((~keep).long(), dim=1, stable=True).indices  # each row's kept tokens first, in order
    inputs = inputs.gather(1, order[..., None].expand_as(inputs))
    stream = torch.cat([state, inputs.transpose(1, 2).to(state.dtype)], dim=-1)  # [B, C, K + W]
    window = keep.sum(-1).to(state.device)[:, None, None] + torch.arange(kernel, device=state.device)
    return stream.gather(2, window.expand(state.shape[0], state.shape[1], kernel))


def linear_states(model: Any, cache: Any, batch_size: int) -> LinearStates | None:
    """The rollback of ``model``'s stateful layers over ``cache``: short convolutions (Inkling), linear attention
    (Qwen3.5), or None for an attention-only model."""
    if _compat.has_short_convs(model.config):
        return ShortConvStates(model, cache, batch_size)
    return linear.linear_states(model, cache, batch_size)
