"""Where a model runs when accelerate dispatched it (``from_pretrained(..., device_map=...)``).

A dispatched model may hold some weights on the meta device (offloaded to CPU RAM or disk, loaded by
accelerate's hooks just for their forward) and spread its layers over several devices, so
``model.device`` (its first parameter's device) can be ``meta`` or a device its inputs never go to.
Its input embeddings' hook names the device that really runs them.

    >>> import torch
    >>> from hf_specmm import testing
    >>> execution_device(testing.tiny_target("llava"))
    device(type='cpu')

:func:`without_cudnn_attention` keeps PyTorch's cuDNN attention out of a speculative call on CUDA.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

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


_CUDNN = {"lock": threading.Lock(), "calls": 0, "cleared": False}


@contextmanager
def without_cudnn_attention(device: torch.device) -> Iterator[None]:
    """Scaled-dot-product attention without its cuDNN backend while a speculative call runs on ``device``.

    cuDNN attention builds a graph for each new (query length, key length) shape the first time it meets it, and a
    speculative call meets new shapes at nearly every round (the round's width over a cache that grew by a varying
    number of tokens); the flash, memory-efficient and math kernels build nothing per shape. The backend flag is
    process-wide: it is cleared while any such call runs and restored when the last one ends. Nothing changes off
    CUDA, where cuDNN attention is off already, or where the caller left it the only fused kernel enabled."""
    cuda = torch.backends.cuda
    if device.type != "cuda" or not hasattr(cuda, "cudnn_sdp_enabled"):  # torch without cuDNN attention
        yield
        return
    with _CUDNN["lock"]:
        if _CUDNN["calls"] == 0:
            fused = cuda.flash_sdp_enabled() or cuda.mem_efficient_sdp_enabled()  # math alone: far slower
            _CUDNN["cleared"] = cuda.cudnn_sdp_enabled() and fused
            if _CUDNN["cleared"]:
                cuda.enable_cudnn_sdp(False)
        _CUDNN["calls"] += 1
    try:
        yield
    finally:
        with _CUDNN["lock"]:
            _CUDNN["calls"] -= 1
            if _CUDNN["calls"] == 0 and _CUDNN["cleared"]:
                cuda.enable_cudnn_sdp(True)
