"""Reading a target checkpoint's own MTP tensors (and nothing else) into an :class:`MtpDraft`.

Three layouts, told apart by the tensors' names and declared by the checkpoint's config (read as JSON data):

- **vLLM / Qwen3.5** (``qwen3_5_mtp.py``, ``qwen3_next_mtp.py``): ``mtp.fc``, ``mtp.pre_fc_norm_embedding``,
  ``mtp.pre_fc_norm_hidden``, ``mtp.layers.{k}.*``, ``mtp.norm``; the count in ``mtp_num_hidden_layers``
  (``num_nextn_predict_layers`` in older configs).
- **transformers** (``MtpModel`` / ``MtpLayer``, DeepSeek-style checkpoints, Step3.7): MTP layer k
  stored as decoder layer ``num_hidden_layers + k``: ``layers.{N+k}.eh_proj``, ``enorm``, ``hnorm``,
  ``shared_head.norm`` (or ``post_norm``) and the decoder block's own tensors beside them (or under
  ``transformer_block.``, with ``input_proj`` / ``embed_norm`` / ``hidden_norm``, names ``MtpModel`` reads too);
  the count in ``num_mtp_layers`` or ``num_nextn_predict_layers``. ``shared_head.head`` and ``embed_tokens``
  copies are the target's LM head and embedding, which the draft binds instead (not read).
- **Inkling** (:mod:`.inkling`): ``model.mtp.layers.{k}.input_proj`` / ``embed_norm`` / ``hidden_norm``, the
  decoder block under ``transformer_block.`` in the checkpoint's own names, ``model.mtp.chain_norm``; the count in
  ``num_mtp_layers`` (``mtp_config.num_nextn_predict_layers`` in the checkpoint's own config).

Several MTP layers: layer k is draft step k's (the draft's ``later_layers.{k-1}`` for k >= 1); vLLM's layout
stores one ``fc`` and set of norms for all of them (each layer gets them). MoE layers' experts are fused as
transformers' decoder layers hold them, from one tensor per expert or Step3.7's stacked ``moe.*`` (:mod:`.experts`).

Only the shards that hold MTP tensors are opened, and only those tensors are read. Every problem (no MTP
tensors, no declared count, a count the tensors contradict, a shard the index names that is absent, a tensor
whose shape does not fit the target) is a :class:`~hf_specmm.errors.DraftLoadError` naming the file and the
tensor, raised before the draft runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import torch

from ...errors import DraftLoadError, IncompatibleDraftError
from ..checkpoints import read_checked_tensors, read_config_json
from . import experts, inkling

#: config fields that declare a checkpoint's MTP layer count (the text config's, or the top-level config's)
COUNT_FIELDS = ("mtp_num_hidden_layers", "num_nextn_predict_layers", "num_mtp_layers")
_VLLM = re.compile(r"^mtp\.(?:layers\.(\d+)\.)?(.+)$")
_VLLM_NAMES = {"fc.weight": "fc.weight", "pre_fc_norm_embedding.weight": "pre_fc_norm_embedding.weight",
               "pre_fc_norm_hidden.weight": "pre_fc_norm_hidden.weight", "norm.weight": "body.norm.weight"}
_HF_NAMES = {"eh_proj.weight": "fc.weight", "input_proj.weight": "fc.weight",
             "enorm.weight": "pre_fc_norm_embedding.weight", "embed_norm.weight": "pre_fc_norm_embedding.weight",
             "hnorm.weight": "pre_fc_norm_hidden.weight", "hidden_norm.weight": "pre_fc_norm_hidden.weight",
             "shared_head.norm.weight": "body.norm.weight", "post_norm.weight": "body.norm.weight"}
_LAYER = re.compile(r"layers\.(\d+)\.(.+)$")  # a text decoder layer's key, after the decoder's prefix
_SHARED = ("shared_head.head.weight", "embed_tokens.weight")  # the target's own LM head / embedding, bound instead


def layer_name(k: int, name: str) -> str:
    """The draft's name of MTP layer ``k``'s parameter ``name`` (layer 0's as a one-layer draft names it)."""
    return name if k == 0 else f"later_layers.{k - 1}.{name}"


def checkpoint_files(name: str,
                     fetch: Callable[[str], Path | None]) -> tuple[Path, dict[str, Any], dict[str, list[str]] | None]:
    """The target checkpoint's config.json (as data) and its safetensors files: ``(config path, config, weight_map
    as {file: [keys]} from the index, or None: one ``model.safetensors``)``. ``fetch(file)``: the file's local path
    (fetched from the Hub for a Hub id), or None; shards are fetched later, those holding MTP tensors only."""
    config_path = fetch("config.json")
    if config_path is None:
        raise DraftLoadError(f"{name}: no config.json (kind='mtp' reads a target checkpoint: its folder or Hub id)")
    raw = read_config_json(config_path)
    index = fetch("model.safetensors.index.json")
    if index is None:
        single = fetch("model.safetensors")
        if single is None:
            raise DraftLoadError(f"{name}: no model.safetensors nor model.safetensors.index.json; the MTP tensors are "
                                 "read from the target's safetensors only")
        return config_path, raw, None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError) as err:
        raise DraftLoadError(f"{index} is not a safetensors index (a JSON object with weight_map): {err}") from err
    by_file: dict[str, list[str]] = {}
    for key, file in weight_map.items():
        by_file.setdefault(str(file), []).append(str(key))
    return config_path, raw, by_file


def declared_count(raw: dict[str, Any]) -> tuple[str, int] | None:
    """``(field, count)``: the MTP layer count the config declares (text config first), or None."""
    for config in (raw.get("text_config"), raw, raw.get("mtp_config")):  # Inkling's: a top-level mtp_config
        if isinstance(config, dict):
            for field in COUNT_FIELDS:
                value = config.get(field)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return field, value
    return None


def mtp_keys(keys: list[str], num_hidden_layers: int) -> dict[str, tuple[str, int, str]]:
    """{checkpoint key: (layout, MTP layer index, draft parameter name or '' for the target's own copies)} for the
    keys that are MTP tensors, in either layout."""
    found: dict[str, tuple[str, int, str]] = {}
    tables = sorted((k for k in keys if k.endswith("embed_tokens.weight")), key=len)
    decoder = tables[0][: -len("embed_tokens.weight")] if tables else ""  # the text decoder's prefix ("model.")
    for key in keys:
        hit = inkling.classify(key)
        if hit is not None:
            found[key] = (inkling.LAYOUT, hit[0], layer_name(*hit))
            continue
        match = _VLLM.match(key)
        if match is not None:
            layer, rest = match.groups()
            if layer is not None:
                found[key] = ("vllm", int(layer), layer_name(int(layer), "body.layers.0." + experts.layer_name(rest)))
            else:  # fc, the input norms and the output norm: shared by every layer (see read_mtp)
                found[key] = ("vllm", 0, _VLLM_NAMES.get(rest, f"<unknown {rest}>"))
            continue
        match = _LAYER.match(key[len(decoder):]) if key.startswith(decoder) else None
        if match is None or int(match.group(1)) < num_hidden_layers:
            continue
        layer, rest = int(match.group(1)) - num_hidden_layers, match.group(2)
        if rest in _SHARED:
            found[key] = ("transformers", layer, "")
        elif rest in _HF_NAMES:
            found[key] = ("transformers", layer, layer_name(layer, _HF_NAMES[rest]))
        else:
            inner = experts.layer_name(rest.removeprefix("transformer_block."))
            found[key] = ("transformers", layer, layer_name(layer, "body.layers.0." + inner))
    return found


def read_mtp(name: str, target: Any, fetch: Callable[[str], Path | None]) -> Any:
    """The :class:`MtpDraft` of the target checkpoint ``name`` (a folder or Hub id whose files ``fetch`` finds),
    bound to ``target``."""
    from .modeling import MtpDraft

    if target is None:
        raise DraftLoadError("load_draft(..., kind='mtp') needs target=<the loaded target model>: the MTP layer uses "
                             "its embedding and LM head")
    config_path, raw, by_file = checkpoint_files(name, fetch)
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    depth = text.get("num_hidden_layers")
    if not isinstance(depth, int):
        raise DraftLoadError(f"{config_path}: text config has no integer num_hidden_layers")
    folder = config_path.parent
    if by_file is None:
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            by_file = {"model.safetensors": list(f.keys())}
    where = {key: file for file, keys in by_file.items() for key in keys}
    found = mtp_keys(list(where), depth)
    if not found:
        raise DraftLoadError(
            f"{name}: no MTP tensors in {sorted(by_file)} (looked for vLLM's mtp.fc / mtp.layers.0.* and "
            f"transformers' layers.{depth}.eh_proj / enorm / hnorm, Inkling's model.mtp.layers.0.*): this checkpoint "
            "carries no MTP layer; use another draft kind, or train one (hf-specmm train --draft-kind mtp)")
    layouts = sorted({layout for layout, _, _ in found.values()})
    declared = declared_count(raw)
    if declared is None:
        raise DraftLoadError(
            f"{config_path}: holds {layouts[0]}-layout MTP tensors ({next(iter(found))}) but declares no MTP layer "
            f"count ({' / '.join(COUNT_FIELDS)}): no family declares this layout")
    if len(layouts) > 1:
        raise DraftLoadError(f"{name}: MTP tensors in several layouts ({', '.join(layouts)}); which one is the "
                             "checkpoint's cannot be told")
    field, count = declared
    layers = sorted({layer for _, layer, _ in found.values()})
    if layers != list(range(count)):
        extra = next((k for k, (_, layer, _) in found.items() if layer >= count), next(iter(found)))
        raise DraftLoadError(f"{config_path}: {field}={count}, but the MTP tensors hold layers {layers} "
                             f"({where[extra]}: {extra})")
    hidden_first = text.get("mtp_hidden_states_first", raw.get("mtp_hidden_states_first"))  # None: the target's
    draft = MtpDraft.for_target(target, count, target_name=name, hidden_first=hidden_first, source=name,
                                layout=layouts[0])
    wanted: dict[str, str] = {}
    pieces: dict[str, dict[tuple, str]] = {}  # fused MoE tensors, from several stored ones (experts.py)
    split: dict[str, tuple[str, str]] = {}  # one stored tensor, two parameters (Inkling's gate and up rows)
    for key, (_, _, param) in found.items():
        param, part = experts.split_part(param)
        if part is not None:
            pieces.setdefault(param, {})[part] = key
            continue
        if (pair := inkling.halves(param)) is not None:
            split[key] = pair
            continue
        if param and param in wanted:  # two names of one tensor (eh_proj and input_proj, ...): which is meant?
            raise DraftLoadError(f"{where[key]}: MTP tensors {wanted[param]} and {key} are both the layer's {param}")
        if param:
            wanted[param] = key
        if param and (key == inkling.CHAIN_NORM or (layouts[0] == "vllm" and not key.startswith("mtp.layers."))):
            wanted.update({layer_name(k, param): key for k in range(1, count)})  # one for all (vLLM's fc, norms)
    expected = draft.state_dict()
    unknown = [key for param, key in wanted.items() if param not in expected]
    unknown += [key for param, parts in pieces.items() if param not in expected for key in parts.values()]
    unknown += [key for key, pair in split.items() if not set(pair) <= set(expected)]
    if unknown:
        raise DraftLoadError(f"{where[unknown[0]]}: MTP tensor {unknown[0]} has no place in a "
                             f"{type(target).__name__} MTP layer (unexpected tensors: {unknown})")
    halves = {param for pair in split.values() for param in pair}
    missing = [param for param in expected if param not in wanted and param not in pieces and param not in halves]
    if missing:
        raise DraftLoadError(f"{name}: the MTP tensors lack {missing} of a {type(target).__name__} MTP layer "
                             f"(read from {sorted({where[k] for k in wanted.values()})})")
    keys = [*wanted.values(), *(key for parts in pieces.values() for key in parts.values()), *split]
    files = sorted({where[key] for key in keys})
    paths = {file: fetch(file) or folder / file for file in files}
    absent = [file for file, path in paths.items() if not path.is_file()]
    if absent:
        key = next(k for k in keys if where[k] == absent[0])
        raise DraftLoadError(f"{config_path.parent / 'model.safetensors.index.json'} names {absent[0]} for {key}, "
                             "but that shard is absent")
    _check_same_target(folder, name, where, target, fetch)
    state = read_checked_tensors(paths, {key: where[key] for key in wanted.values()}, wanted, expected)
    state.update(experts.read_fused(paths, where, pieces, expected))
    state.update(inkling.read_interleaved(paths, where, split, expected))
    dtype = draft.fc.weight.dtype
    draft.load_state_dict({param: tensor.to(dtype) for param, tensor in state.items()}, strict=True)
    return draft.eval()


def _check_same_target(folder: Path, name: str, where: dict[str, str], target: Any,
                       fetch: Callable[[str], Path | None]) -> None:
    """The target is the checkpoint's model: the first row of its token embedding equals the checkpoint's (one row
    read, within bf16 rounding). An MTP layer drafts only for the weights it was trained beside."""
    from safetensors import safe_open

    tables = sorted((k for k in where if k.endswith("embed_tokens.weight") or k == inkling.TABLE), key=len)
    if not tables:
        return
    key, file = tables[0], where[tables[0]]
    path = fetch(file) or folder / file
    if not path.is_file():
        raise DraftLoadError(f"{folder / 'model.safetensors.index.json'} names {file} for {key}, but that shard is "
                             "absent")
    with safe_open(str(path), framework="pt") as f:
        row = f.get_slice(key)[0:1].float()
    mine = target.get_input_embeddings().weight[0:1].detach().float().cpu()
    if row.shape[-1] != mine.shape[-1] or not torch.allclose(row, mine, rtol=1e-2, atol=1e-5):
        raise IncompatibleDraftError(
            f"{name}: the target's token embedding differs from the checkpoint's ({file}: {key}): its MTP layer "
            f"drafts for the model it was trained beside; pass the {type(target).__name__} loaded from {name}")
