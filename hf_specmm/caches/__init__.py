"""Cache backends of the speculative loop (see :mod:`hf_specmm.caches.base` for the slot model)."""

from .base import CacheFactory, SlottedCache
from .dynamic import DynamicBackend, DynamicSlottedCache

__all__ = ["CacheFactory", "DynamicBackend", "DynamicSlottedCache", "SlottedCache"]
