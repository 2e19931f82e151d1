from .configuration import ImageAdapterDraftConfig
from .modeling import ImageAdapter, ImageAdapterDraft, pool_image_features

__all__ = ["ImageAdapter", "ImageAdapterDraft", "ImageAdapterDraftConfig", "pool_image_features"]
