"""Supported target families and the token ids each one reserves for non-text placeholders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import UnsupportedTargetError


@dataclass(frozen=True)
class TargetFamily:
    """A multimodal architecture whose text stream can be drafted by a small LM."""

    name: str
    class_name: str
    # config attributes naming placeholder token ids, first found wins per tuple
    placeholder_attrs: tuple[tuple[str, ...], ...]


SUPPORTED_TARGETS: dict[str, TargetFamily] = {
    f.class_name: f
    for f in (
        TargetFamily("llava", "LlavaForConditionalGeneration", (("image_token_id", "image_token_index"),)),
        TargetFamily("llava_next", "LlavaNextForConditionalGeneration", (("image_token_id", "image_token_index"),)),
        TargetFamily(
            "llava_onevision",
            "LlavaOnevisionForConditionalGeneration",
            (("image_token_id", "image_token_index"), ("video_token_id", "video_token_index")),
        ),
    )
}


def target_family(model: Any) -> TargetFamily:
    """Return the family of ``model`` or raise listing the supported classes."""
    name = type(model).__name__
    family = SUPPORTED_TARGETS.get(name)
    if family is None:
        supported = ", ".join(sorted(SUPPORTED_TARGETS))
        raise UnsupportedTargetError(
            f"hf_specmm cannot speculate for a {name}. Supported targets: {supported}. "
            "Load the model with one of these classes (e.g. LlavaForConditionalGeneration.from_pretrained)."
        )
    return family


@dataclass(frozen=True)
class TargetSpec:
    """What the decoding loop needs to know about a target's vocabulary."""

    family: TargetFamily
    vocab_size: int  # rows of the target's LM head
    placeholder_ids: frozenset[int]  # image/video placeholders: removed from the draft's view
    reserved_ids: frozenset[int]  # never proposed by a draft (placeholders and the pad id)

    @property
    def text_vocab_end(self) -> int:
        """Ids below this are the target's ordinary text ids (placeholders are appended after them)."""
        appended = [i for i in self.reserved_ids if i >= min(self.placeholder_ids, default=self.vocab_size)]
        return min(appended + [self.vocab_size])


def target_spec(model: Any) -> TargetSpec:
    family = target_family(model)
    config = model.config
    placeholders: set[int] = set()
    for attrs in family.placeholder_attrs:
        for attr in attrs:
            value = getattr(config, attr, None)
            if value is not None:
                placeholders.add(int(value))
                break
    text_config = config.get_text_config()
    reserved = set(placeholders)
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        pad = getattr(text_config, "pad_token_id", None)
    # a pad id appended after the placeholders (LLaVA-1.5: <image>=32000, <pad>=32001) is not text
    if pad is not None and placeholders and int(pad) > min(placeholders):
        reserved.add(int(pad))
    return TargetSpec(family, int(text_config.vocab_size), frozenset(placeholders), frozenset(reserved))
