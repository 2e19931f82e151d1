"""Checks of the prompt itself, before any forward: image placeholders that match the images passed (a
mismatch would fail deep inside the target's forward), and left padding where the loop cannot learn how
stock ``generate`` numbers a right-padded prompt (it continues from the last column's position + 1,
which the loop follows whenever stock's prompt ``position_ids`` are at hand)."""

from __future__ import annotations

from typing import Any

import torch

from .errors import UnsupportedGenerationError
from .targets import TargetSpec


def check_left_padded(attention_mask: torch.Tensor | None) -> None:
    """Every row's valid tokens must be one block at the right end (left padding). Called only where the
    continuation positions of a right-padded row cannot be taken from stock ``generate``."""
    if attention_mask is None:
        return
    mask = attention_mask.bool()
    after_valid = mask.long().cumsum(-1) > 0  # at or after the row's first valid token
    gaps = (after_valid & ~mask).any(-1)
    if bool(gaps.any()):
        rows = gaps.nonzero().flatten().tolist()
        raise UnsupportedGenerationError(
            f"Rows {rows} of the attention mask have padding after their first token (right padding): "
            "decoder-only generation continues from the last column, so every row must be left-padded. "
            "Set processor.tokenizer.padding_side = 'left' (or tokenizer.padding_side = 'left') and re-encode.")


def _images_passed(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, torch.Tensor):
        return int(value.shape[0])
    return len(value)


def _runs(is_image: torch.Tensor) -> list[int]:
    """Per row, the number of separate runs of consecutive placeholders."""
    starts = is_image & ~torch.nn.functional.pad(is_image, (1, 0))[:, :-1]
    return starts.sum(-1).tolist()


def check_placeholders(spec: TargetSpec, config: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       image_inputs: dict[str, Any]) -> None:
    """Placeholders without images, images without placeholders, more placeholder runs than images (in the
    families where every image is one contiguous run, LLaVA-1.5 included), and (where a family expands every
    image into a fixed number of placeholders) per-row counts that are not a whole number of images. Each
    would otherwise fail inside the target's forward ("Image features and image tokens do not match")."""
    family = spec.family
    ids = sorted(spec.placeholder_ids)
    if not ids:
        return
    image_id = next((int(getattr(config, a)) for a in family.placeholder_attrs[0] if getattr(config, a, None)
                     is not None), ids[0])
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    is_image = (input_ids == image_id) & valid
    per_row = is_image.sum(-1).tolist()
    source = family.image_count_input  # pixel_values, or (Qwen-VL: pixel_values are patches) image_grid_thw
    images = _images_passed(image_inputs.get(source)) if image_inputs.get("pixel_values") is not None else 0
    total = sum(per_row)
    if total and not images:
        rows = [f"row {i}: {c}" for i, c in enumerate(per_row) if c]
        raise UnsupportedGenerationError(
            f"The prompt holds image placeholders ({', '.join(rows)}) but no images were passed: pass "
            f"{source} (the processor's output for the images) or remove the image tokens from the text.")
    if images and not total:
        raise UnsupportedGenerationError(
            f"{images} image(s) were passed but no row of input_ids holds an image placeholder (id {image_id}): "
            "let the processor insert them (e.g. apply_chat_template with an image entry, or '<image>' in the text).")
    width = getattr(config, family.tokens_per_image_attr, None) if family.tokens_per_image_attr else None
    if width and images:
        # every image expands to the same number of placeholders; derived from the prompt itself, so a
        # config whose image_seq_length disagrees with its vision tower does not cause a false refusal
        counts = ", ".join(f"row {i}: {c}" for i, c in enumerate(per_row))
        each = total // images if total % images == 0 else 0
        uneven = [i for i, c in enumerate(per_row) if c and (not each or c % each)]
        if uneven:
            raise UnsupportedGenerationError(
                f"Image placeholders do not match the images: the rows hold {counts} placeholders ({total} in "
                f"all) for {images} image(s) of equal placeholder count (the config says {width} each); rows "
                f"{uneven} cannot hold a whole number of images. Build input_ids and pixel_values with the same "
                "processor call.")
    if family.one_run_per_image and images:
        # each image is one contiguous run (adjacent images may merge into one), so a prompt cannot hold
        # more runs than images; the per-image count cannot tell, since it is derived from the prompt itself
        groups = _runs(is_image)
        if sum(groups) > images:
            rows = ", ".join(f"row {i}: {g} group(s), {c} placeholders" for i, (g, c) in
                             enumerate(zip(groups, per_row)) if g)
            raise UnsupportedGenerationError(
                f"The prompt holds {sum(groups)} separate image placeholder groups ({rows}) but {images} image(s) "
                f"were passed ({source} has {images} row(s)); every image is one group of placeholders. Build "
                "input_ids and the image inputs with the same processor call (one image entry per image).")
