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


class UnsupportedTransformersError(SpecMMError):
    """The installed transformers lacks (or changed) a private internal hf_specmm reads."""


class DraftLoadError(SpecMMError):
    """A draft checkpoint that cannot be loaded: missing, corrupt, or not in safetensors."""


class DraftTargetError(DraftLoadError, IncompatibleDraftError):
    """A draft checkpoint made for another target: ``load_draft(..., target=...)`` compares what its config.json and
    weight headers declare with the target before any of its tensors is allocated. Both a
    :class:`DraftLoadError` (the checkpoint is refused) and an :class:`IncompatibleDraftError` (the same rule
    ``generate`` applies to a draft passed without a target check)."""


def check_strict_load(info: dict[str, Any], what: str) -> None:
    """Raise :class:`DraftLoadError` if ``from_pretrained(..., output_loading_info=True)`` reported missing,
    unexpected or mis-shaped weights: transformers only warns, and a partly random model would make every
    measurement meaningless. Mis-shaped weights are named with both shapes (the file's and what the config
    makes), which transformers reports when loading with ``ignore_mismatched_sizes=True``."""
    problems = []
    for key, label in (("missing_keys", "missing"), ("unexpected_keys", "unexpected")):
        if info.get(key):
            problems.append(f"{label} weights {sorted(info[key])}")
    mismatched = info.get("mismatched_keys") or []
    if mismatched:
        shapes = []
        for entry in sorted(mismatched, key=str):
            if isinstance(entry, (tuple, list)) and len(entry) == 3:
                shapes.append(f"{entry[0]} is {list(entry[1])} in the file, {list(entry[2])} by config.json")
            else:
                shapes.append(str(entry))
        problems.append("mis-shaped weights (" + "; ".join(shapes) + ")")
    if problems:
        raise DraftLoadError(f"{what} does not match its config.json: " + "; ".join(problems) + ".")
