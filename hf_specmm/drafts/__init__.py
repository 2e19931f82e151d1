"""Draft kinds that need their own model class (a text-only draft is any transformers causal LM)."""

from .image_adapter import ImageAdapterDraft, ImageAdapterDraftConfig

__all__ = ["ImageAdapterDraft", "ImageAdapterDraftConfig"]
