"""What a draft checkpoint declares, checked before anything is built from it: the config.json's size fields (type
and range), its ``model_type``, the shard names of its safetensors index, and the tensor shapes the config makes
against the shapes the weight files' headers hold (the model is laid out on the meta device: no tensor is
allocated until every shape matches). Each check raises :class:`~hf_specmm.errors.DraftLoadError` naming the file
and the field.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch
from safetensors import safe_open
from transformers import CONFIG_MAPPING

from ..errors import DraftLoadError

try:  # transformers' config classes validate their fields through huggingface_hub's strict dataclasses
    from huggingface_hub.errors import StrictDataclassError as config_field_error
except ImportError:  # an older huggingface_hub: transformers raises ValueError / TypeError, handled by the caller
    class config_field_error(Exception):  # type: ignore[no-redef]
        """Never raised."""

# size and id fields of a model config: integers when present (null where a config leaves one unset)
INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "block_size", "mask_token_id",
              "image_token_id", "image_token_index", "draft_vocab_size", "target_num_layers", "sliding_window")
INT_LIST_FIELDS = ("target_layer_ids", "aux_layers")


def _where(source: str, path: str) -> str:
    return f"{source}: {path}"


def check_declared_fields(raw: dict[str, Any], source: str, prefix: str = "") -> None:
    """:data:`INT_FIELDS` are integers >= 0 (or null) and :data:`INT_LIST_FIELDS` lists of layer ids >= -1, at the top level
    and in every nested ``*_config`` object (a string ``"128"`` is refused, not converted)."""
    for name in INT_FIELDS:
        value = raw.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise DraftLoadError(f"{_where(source, prefix + name)} must be an integer >= 0, got {value!r}")
    for name in INT_LIST_FIELDS:
        value = raw.get(name)
        if value is None:
            continue
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < -1 for v in value):
            raise DraftLoadError(f"{_where(source, prefix + name)} must be a list of layer ids, integers >= -1 "
                                 f"(-1: the embedding output), got {value!r}")
    for name, value in raw.items():
        if name.endswith("_config") and isinstance(value, dict):
            check_declared_fields(value, source, f"{prefix}{name}.")


def check_model_type(raw: dict[str, Any], source: str, trust_remote_code: bool) -> None:
    """A ``model_type`` transformers knows (one defined by the checkpoint's own code is for
    ``trust_remote_code=True``, checked apart)."""
    model_type = raw.get("model_type")
    if model_type is None:
        raise DraftLoadError(f"{_where(source, 'model_type')} is missing: transformers cannot tell which model the "
                             "checkpoint holds (a saved draft's config.json names it, e.g. \"llama\")")
    if not isinstance(model_type, str):
        raise DraftLoadError(f"{_where(source, 'model_type')} must be a string, got {model_type!r}")
    if model_type not in CONFIG_MAPPING and not (trust_remote_code and raw.get("auto_map")):
        import transformers

        raise DraftLoadError(f"{_where(source, 'model_type')} {model_type!r} is not a model type transformers "
                             f"{transformers.__version__} knows: a newer transformers, or another checkpoint")


def check_shard_name(name: Any, index: Path) -> str:
    """A shard named by ``model.safetensors.index.json``: a plain file name in the index's own folder (no ``..``,
    no path separator, not absolute), so an index cannot point at another folder's weights."""
    if not isinstance(name, str) or not name:
        raise DraftLoadError(f"{index}: weight_map names a shard {name!r}, not a file name")
    if (name in (".", "..") or "/" in name or "\\" in name or PurePosixPath(name).is_absolute()
            or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive):
        raise DraftLoadError(f"{index}: weight_map names the shard {name!r}; a shard is a file beside the index "
                             "(no '..', no path separator, no absolute path)")
    return name


def header_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Per tensor, its shape as the safetensors headers declare it (no tensor is read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def _fields_of(config: Any, value: int) -> list[str]:
    """The config's integer fields (nested ones too) equal to ``value``: the field a mis-shaped dimension comes from."""
    found = []

    def walk(entries: dict, prefix: str) -> None:
        for name, item in entries.items():
            if isinstance(item, dict):
                walk(item, f"{prefix}{name}.")
            elif isinstance(item, int) and not isinstance(item, bool) and item == value:
                found.append(prefix + name)

    walk(config.to_dict(), "")
    return found


def meta_layout(cls: Any, config: Any) -> Any | None:
    """The model ``cls`` builds from ``config``, laid out on the meta device (shapes, no storage), or None where it
    cannot be: a config that names the checkpoint's own code (laying it out could run it), or a class that fails on
    meta (the strict load and the checks after it then cover what this would have)."""
    if getattr(config, "auto_map", None):
        return None
    try:
        with torch.device("meta"):
            if hasattr(cls, "from_config"):  # an Auto class: transformers' own class for this model_type
                return cls.from_config(config, trust_remote_code=False)
            return cls(config)
    except Exception:
        return None


def check_declared_shapes(model: Any, config: Any, files: list[Path], source: str) -> None:
    """The tensors of ``model`` (the :func:`meta_layout` of ``config``) against the weight files' headers: a tensor
    both hold with another shape is refused, naming both shapes and the config field of the differing size, before
    any tensor is allocated. Tensors only one side holds are the strict load's to report."""
    declared = header_shapes(files)
    wrong, fields = [], set()
    for name, tensor in model.state_dict().items():
        shape = declared.get(name)
        if shape is None or tuple(tensor.shape) == shape:
            continue
        wrong.append(f"{name} is {list(shape)} in the file, {list(tensor.shape)} by config.json")
        if len(shape) == tensor.dim():
            for mine, theirs in zip(tensor.shape, shape):
                if mine != theirs:
                    fields.update(_fields_of(config, int(mine)))
    if wrong:
        hint = f"; the sizes of config.json's {', '.join(sorted(fields))}" if fields else ""
        raise DraftLoadError(f"draft checkpoint {source} does not match its config.json: mis-shaped weights ("
                             + "; ".join(sorted(wrong)) + f"){hint}. Refused before any tensor was allocated.")
