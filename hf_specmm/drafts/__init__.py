"""Draft kinds, one folder each, registered in ``registry`` by their own ``__init__``:
``text_only`` (any causal LM), ``image_adapter`` (LM + adapter on the target's image embeddings),
``vlm`` (a small VLM of a supported family that sees the images), ``feature_head`` (an EAGLE-1 style head
on the target's own last hidden states), ``dflash`` (a DFlash block drafter on the target's features),
``gemma4_assistant`` (a Gemma 4 checkpoint's own assistant on the target's shared K/V)."""

from . import dflash, feature_head, gemma4_assistant, image_adapter, mtp, text_only, vlm  # noqa: F401  (each registers its kind)
from .feature_head import FeatureHeadDraft, FeatureHeadDraftConfig
from .image_adapter import ImageAdapterDraft, ImageAdapterDraftConfig
from .mtp import MtpDraft
from .registry import DraftKind, draft_kinds, get_kind, kind_of, loading_class, register_draft_kind
from .text_only import TextOnly

__all__ = ["DraftKind", "FeatureHeadDraft", "FeatureHeadDraftConfig", "ImageAdapterDraft", "ImageAdapterDraftConfig", "MtpDraft", "TextOnly", "draft_kinds", "get_kind",
           "kind_of", "loading_class", "register_draft_kind"]
