"""One validation of a feature head's checkpoint: its config.json fields (native, ``speculators`` and SGLang
layouts), its tensors' shapes and its vocabulary maps (``d2t`` / ``t2d``), before any weight is used.

Each check raises :class:`~hf_specmm.errors.DraftLoadError` naming the file and the field (a corrupt or stale
checkpoint), or :class:`~hf_specmm.errors.IncompatibleDraftError` when the maps do not fit the target at hand.
A checkpoint's config.json is read as JSON data here, never through code the checkpoint ships.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import DraftLoadError

FEATURE_HEAD_TYPE = "hf_specmm_feature_head"
EAGLE3_HEAD_TYPE = "hf_specmm_eagle3_head"
MTP_TYPE = "hf_specmm_mtp"  # an MTP layer (drafts/mtp/) is a feature head with input norms
HEAD_TYPES = (FEATURE_HEAD_TYPE, EAGLE3_HEAD_TYPE, MTP_TYPE)
# the fields of a decoder config every head reads (its width, depth, vocabulary, attention heads)
LAYER_FIELDS = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads")
# speculators 0.9's norm options (Eagle3HeadConfig's fields of the same names): true, false or absent
NORM_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


def too_few_aux_layers(aux: list[int]) -> str | None:
    """Why an EAGLE-3 head cannot read only ``aux`` (None: it can). With one layer, the fused target features
    and the head's own fed-back features have the same width, and width is how the head tells them apart."""
    if len(aux) >= 2:
        return None
    return (f"aux_layers={list(aux)}: an EAGLE-3 head fuses two or more target layers (with one, fc's input has the "
            "width of the head's own fed-back features); use two or more, or an EAGLE-1 head (variant='eagle1')")


def _fail(source: str, field: str, message: str) -> DraftLoadError:
    return DraftLoadError(f"{source}: {field} {message}")


def checked_int(value: Any, field: str, source: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int in [low, high] (a bool, float or string is refused, not converted)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(source, field, f"must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"{'' if low is None else low}..{'' if high is None else high}"
        raise _fail(source, field, f"must be in {span}, got {value}")
    return value


def checked_int_list(value: Any, field: str, source: str, low: int | None = None,
                     high: int | None = None) -> list[int]:
    """A non-empty JSON list of ints in [low, high]."""
    if not isinstance(value, list) or not value:
        raise _fail(source, field, f"must be a non-empty list of integers, got {value!r}")
    return [checked_int(v, f"{field}[{i}]", source, low, high) for i, v in enumerate(value)]


def checked_layer_config(value: Any, field: str, source: str) -> dict[str, Any]:
    """A decoder config as a JSON object holding the fields of :data:`LAYER_FIELDS`, each an int >= 1."""
    if not isinstance(value, dict):
        raise _fail(source, field or "config", f"must be a JSON object (a decoder config), got {value!r}")
    for name in LAYER_FIELDS:
        where = f"{field}.{name}" if field else name
        if name not in value:
            raise _fail(source, where, "is missing")
        checked_int(value[name], where, source, low=1)
    return value


def _check_fingerprint(value: Any, source: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or set(value) != {"embed", "lm_head"}:
        raise _fail(source, "target_fingerprint", 'must be null or {"embed": ..., "lm_head": ...} as '
                    f"FeatureHeadDraft.for_target writes it, got {str(value)[:80]!r}")
    for name, entry in value.items():
        field = f"target_fingerprint.{name}"
        if not isinstance(entry, dict) or not isinstance(entry.get("values"), list):
            raise _fail(source, field, f'must be {{"shape": [...], "values": [...]}}, got {str(entry)[:80]!r}')
        checked_int_list(entry.get("shape"), f"{field}.shape", source, low=1)
        if not entry["values"] or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in entry["values"]):
            raise _fail(source, f"{field}.values", "must be a non-empty list of numbers")


def check_head_config(raw: dict[str, Any], source: str) -> None:
    """The config.json of a head saved in hf_specmm's own layout (``model_type`` :data:`HEAD_TYPES`). A config
    that holds a head's fields under another ``model_type`` is refused too (it would load as something else)."""
    model_type = raw.get("model_type")
    if model_type not in HEAD_TYPES:
        head_fields = sorted({"target_fingerprint", "aux_layers", "layer_config"} & raw.keys())
        if head_fields and "text_config" in raw:
            raise _fail(source, "model_type", f"is {model_type!r}, but the file holds a feature head's fields "
                        f"{head_fields}: a head's model_type is {' or '.join(HEAD_TYPES)}")
        return
    text = checked_layer_config(raw.get("text_config"), "text_config", source)
    _check_fingerprint(raw.get("target_fingerprint"), source)
    if model_type != EAGLE3_HEAD_TYPE:
        return
    layer = checked_layer_config(raw.get("layer_config"), "layer_config", source)
    if layer["hidden_size"] != text["hidden_size"]:
        raise _fail(source, "layer_config.hidden_size", f"is {layer['hidden_size']}, text_config.hidden_size is "
                    f"{text['hidden_size']}: both are the target's width")
    depth = raw.get("target_num_layers")
    if depth is not None:
        checked_int(depth, "target_num_layers", source, low=1)
    if "aux_layers" not in raw:
        raise _fail(source, "aux_layers", "is missing (the target layers the head reads)")
    checked_int_list(raw["aux_layers"], "aux_layers", source, low=0, high=depth)
    if too_few_aux_layers(raw["aux_layers"]):
        raise DraftLoadError(f"{source}: {too_few_aux_layers(raw['aux_layers'])}")
    checked_int(raw.get("draft_vocab_size"), "draft_vocab_size", source, low=1, high=layer["vocab_size"])


def check_engine_config(raw: dict[str, Any], layout: str, source: str) -> None:
    """The config.json of a ``speculators`` or SGLang EAGLE-3 checkpoint: the fields :mod:`.formats` reads."""
    if layout == "speculators":
        layer = checked_layer_config(raw.get("transformer_layer_config"), "transformer_layer_config", source)
        ids, field = raw.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids"
        low = 0
    else:
        layer = checked_layer_config(raw, "", source)
        eagle = raw.get("eagle_config")
        if eagle is not None and not isinstance(eagle, dict):
            raise _fail(source, "eagle_config", f"must be a JSON object, got {eagle!r}")
        ids, field = (eagle or {}).get("eagle_aux_hidden_state_layer_ids"), "eagle_config.eagle_aux_hidden_state_layer_ids"
        low = -1  # SGLang counts layer outputs: -1 is the embeddings
    if ids is not None:
        checked_int_list(ids, field, source, low=low)
    if raw.get("draft_vocab_size") is not None:
        checked_int(raw["draft_vocab_size"], "draft_vocab_size", source, low=1, high=layer["vocab_size"])
    for flag in NORM_FLAGS:
        if raw.get(flag) is not None and not isinstance(raw[flag], bool):
            raise _fail(source, flag, f"must be true or false, got {raw[flag]!r}")


def check_tensor_shapes(expected: dict[str, torch.Size], found: dict[str, tuple[torch.Size, str]], source: str) -> None:
    """Every tensor the head needs, of the shape its config makes (``found``: name -> (shape, file))."""
    missing, unexpected = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or unexpected:
        raise DraftLoadError(f"{source} does not hold this head's tensors: missing {missing}, unexpected {unexpected}")
    wrong = [f"{name} is {list(shape)} in {file}, {list(expected[name])} by config.json"
             for name, (shape, file) in sorted(found.items()) if tuple(shape) != tuple(expected[name])]
    if wrong:
        raise DraftLoadError(f"{source}: tensors do not match config.json (draft_vocab_size, the layer config, the "
                             "auxiliary layers): " + "; ".join(wrong))


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, source: str, vocab: int | None = None,
                     error: type[Exception] = DraftLoadError) -> None:
    """``d2t`` [Vd] int offsets (draft id i proposes target id i + d2t[i]) and ``t2d`` [V] bool: every target
    id in 0..V-1 (``vocab``: the target's V, when known), distinct, and exactly the ids ``t2d`` marks."""
    if d2t.dim() != 1 or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise error(f"{source}: d2t must be a 1-D integer tensor, got {tuple(d2t.shape)} {d2t.dtype}")
    if t2d.dim() != 1 or t2d.dtype != torch.bool:
        raise error(f"{source}: t2d must be a 1-D bool tensor, got {tuple(t2d.shape)} {t2d.dtype}")
    size = t2d.numel()
    if vocab is not None and size != vocab:
        raise error(f"{source}: t2d maps {size} target ids, the target has {vocab}")
    ids = torch.arange(d2t.numel(), device=d2t.device) + d2t.long()
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= size:
        raise error(f"{source}: d2t maps draft ids to target ids {low}..{high}, outside the target's 0..{size - 1} "
                    "(a shifted or corrupt d2t): re-export the head from the checkpoint it was trained as")
    if ids.unique().numel() != ids.numel():
        raise error(f"{source}: d2t maps two draft ids to the same target id")
    if int(t2d.sum()) != ids.numel() or not bool(t2d[ids.to(t2d.device)].all()):
        raise error(f"{source}: t2d does not mark exactly the {ids.numel()} target ids d2t maps to")

