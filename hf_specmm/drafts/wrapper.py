"""A draft wrapped to change how hf_specmm drafts with it (``TextOnly``, ``Tree``), still reading as the draft."""

from __future__ import annotations

from typing import Any

import torch


class DraftWrapper(torch.nn.Module):
    """Wraps one draft module, stored under :attr:`wrapped_name`; every attribute the wrapper lacks (``config``,
    ``device``, ``generation_config``, ...) is read from the wrapped draft, and a call runs it."""

    wrapped_name = "model"

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules[self.wrapped_name], name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._modules[self.wrapped_name](*args, **kwargs)
