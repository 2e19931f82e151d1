"""Cache backends of the speculative loop (see :mod:`hf_specmm.caches.base` for the slot model)."""

from .base import CacheFactory, SlottedCache, mask_to
from .dynamic import DynamicBackend, DynamicSlottedCache
from .static import StaticBackend, StaticSlottedCache, WindowMasks


def backend_for(cache_implementation: str | None) -> DynamicBackend | StaticBackend:
    """The backend of a call's ``cache_implementation`` (None / "dynamic" or "static"; others are refused
    before any work by the call's checks)."""
    return StaticBackend() if cache_implementation == "static" else DynamicBackend()


__all__ = ["CacheFactory", "DynamicBackend", "DynamicSlottedCache", "SlottedCache", "StaticBackend",
           "StaticSlottedCache", "WindowMasks", "backend_for", "mask_to"]
