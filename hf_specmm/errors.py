"""Errors raised before any work starts. All are ``ValueError``s so callers can catch them broadly."""

from __future__ import annotations

from typing import Any


class SpecMMError(ValueError):
    """Base class of every input error hf_specmm raises."""


class UnsupportedTargetError(SpecMMError):
    """The target model's class is not one hf_specmm knows how to speculate for."""


class IncompatibleDraftError(SpecMMError):
    """The draft cannot propose the target's token ids (vocabulary, context window, device)."""


class UnsupportedGenerationError(SpecMMError):
    """A generate() option that speculative decoding with a draft cannot honour."""


class DraftLoadError(SpecMMError):
    """A draft checkpoint that cannot be loaded: missing, corrupt, or not in safetensors."""


def check_strict_load(info: dict[str, Any], what: str) -> None:
    """Raise if ``from_pretrained(..., output_loading_info=True)`` reported missing, unexpected or mis-shaped
    weights: transformers only warns, and a partly random model would make every measurement meaningless."""
    problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if problems:
        raise SpecMMError(f"{what} does not match its config: {problems}")
