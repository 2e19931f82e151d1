"""Where a model runs when accelerate dispatched it (``from_pretrained(..., device_map=...)``).

A dispatched model may hold some weights on the meta device (offloaded to CPU RAM or disk, loaded by
accelerate's hooks just for their forward) and spread its layers over several devices, so
``model.device`` (its first parameter's device) can be ``meta`` or a device its inputs never go to.
Its input embeddings' hook names the device that really runs them.

    >>> import torch
    >>> from hf_specmm import testing
    >>> execution_device(testing.tiny_target("llava"))
    device(type='cpu')
"""

from __future__ import annotations

from typing import Any

import torch


def _hook_device(module: Any) -> torch.device | None:
    hook = getattr(module, "_hf_hook", None)
    for h in getattr(hook, "hooks", None) or [hook]:  # a SequentialHook holds several
        device = getattr(h, "execution_device", None)
        if device is not None:
            return torch.device(device)
    return None


def execution_device(model: Any) -> torch.device:
    """The device a model's ``input_ids`` should be on: where its input embeddings run (accelerate's
    dispatch hook), else where they are, else where its first parameter is."""
    try:
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    except NotImplementedError:  # a model with no embedding of its own (a DFlash drafter reads its target's)
        embeddings = None
    for module in (embeddings, model):
        if module is not None:
            device = _hook_device(module)
            if device is not None:
                return device
    weight = getattr(embeddings, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.device.type != "meta":
        return weight.device
    return next(model.parameters()).device
