"""MTP layers in vLLM ``speculators``' ``mtp`` layout (speculators 0.9 ``MTPSpeculatorConfig`` / ``MTPDraftModel``):
``save_pretrained(path, format="speculators")`` writes it, ``load_draft(path, target=model)`` reads it.

The layout: config.json with ``speculators_model_type: "mtp"``, ``num_nextn_predict_layers: 1``, the MTP layer's
decoder config as ``transformer_layer_config`` and ``speculators_config`` (the verifier); model.safetensors with
``mtp_layers.0.input_proj`` (our ``fc``), ``token_layernorm`` / ``hidden_layernorm`` (the input norms),
``final_layernorm`` (the output norm) and the decoder layer's own tensors under ``mtp_layers.0.``. The embedding and
LM head are the verifier's, stored by neither side. speculators runs the same step (``[norm(embedding);
norm(hidden)]``, one layer reused per step, slots at their hidden state's positions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from ...errors import DraftLoadError, IncompatibleDraftError
from ..checkpoints import read_checked_tensors, read_config_json, weight_files

_THEIRS = {"fc.weight": "mtp_layers.0.input_proj.weight",
           "pre_fc_norm_embedding.weight": "mtp_layers.0.token_layernorm.weight",
           "pre_fc_norm_hidden.weight": "mtp_layers.0.hidden_layernorm.weight",
           "body.norm.weight": "mtp_layers.0.final_layernorm.weight"}
_OURS = {v: k for k, v in _THEIRS.items()}


def theirs(name: str) -> str:
    return _THEIRS.get(name) or "mtp_layers.0." + name.removeprefix("body.layers.0.")


def ours(name: str) -> str:
    return _OURS.get(name) or "body.layers.0." + name.removeprefix("mtp_layers.0.")


def export_mtp(draft: Any, save_directory: str | Path) -> Path:
    """Write ``draft`` in speculators' ``mtp`` layout: config.json + model.safetensors."""
    if draft.config.num_layers != 1:
        raise ValueError(f"speculators' mtp layout holds one MTP layer (num_nextn_predict_layers=1); this draft has "
                         f"{draft.config.num_layers}: save it with format='hf_specmm'")
    if draft.config.hidden_first:
        raise ValueError("speculators' MTP layer reads [embedding; hidden]; this one reads [hidden; embedding] "
                         "(mtp_hidden_states_first): save it with format='hf_specmm'")
    if draft.config.post_norm != "layer" or draft.config.raw_embeddings or draft.config.logits_divisor != 1.0:
        raise ValueError("speculators' MTP layer norms its output, reads the target's input embeddings and feeds "
                         "its LM head unscaled; this one (as transformers' MtpModel runs Inkling's) does not: save "
                         "it with format='hf_specmm'")
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    layer = draft.config.text_config.to_diff_dict()
    layer["model_type"] = draft.config.text_config.model_type
    for key in ("_attn_implementation_autoset", "transformers_version", "architectures", "dtype", "torch_dtype"):
        layer.pop(key, None)
    config = draft.config
    out = {"architectures": ["MTPDraftModel"], "speculators_model_type": "mtp", "num_nextn_predict_layers": 1,
           "transformer_layer_config": layer,
           "speculators_config": {
               "algorithm": "mtp", "default_proposal_method": "greedy",
               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
               "verifier": {"name_or_path": config.target,
                            "architectures": [config.target_class] if config.target_class else []}},
           "hf_specmm": {"target": config.target, "target_class": config.target_class,
                         "target_fingerprint": config.target_fingerprint}}
    (folder / "config.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    state = {theirs(k): v.detach().contiguous().cpu() for k, v in draft.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def is_speculators_mtp(raw: dict[str, Any]) -> bool:
    """Whether a config.json (as data) is of a speculators ``mtp`` checkpoint."""
    return raw.get("speculators_model_type") == "mtp"


def import_mtp(draft_class: Any, folder: str | Path, target: Any, name: str | None = None) -> Any:
    """A speculators ``mtp`` checkpoint folder as a ``draft_class`` (:class:`MtpDraft`) for ``target`` (strict:
    every tensor used, none missing, each of the shape the target's MTP layer has)."""
    from safetensors import safe_open

    folder = Path(folder)
    name = name or str(folder)
    config_path = folder / "config.json"
    raw = read_config_json(config_path)
    if target is None:
        raise DraftLoadError(f"{name} is a speculators MTP layer: it reads its target's hidden states, embedding and "
                             "LM head, so load it with its target: hf_specmm.load_draft(path, target=model)")
    count = raw.get("num_nextn_predict_layers", 1)
    if count != 1:
        raise DraftLoadError(f"{config_path}: num_nextn_predict_layers={count!r}: hf_specmm reads single-layer MTP "
                             "checkpoints only (speculators 0.9 writes 1)")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise DraftLoadError(f"{config_path}: transformer_layer_config must be a JSON object (the MTP layer's config)")
    text = target.config.get_text_config()
    for field in ("hidden_size", "vocab_size"):
        if layer.get(field) not in (None, getattr(text, field, None)):
            raise IncompatibleDraftError(f"{name}: transformer_layer_config.{field} is {layer.get(field)}, the "
                                         f"target's is {getattr(text, field, None)}: a layer made for another target")
    draft = draft_class.for_target(target, target_name=(raw.get("hf_specmm") or {}).get("target") or name,
                                source=name, layout="speculators")
    expected = draft.state_dict()
    paths = {path.name: path for path in weight_files(folder, name)}
    files: dict[str, str] = {}
    for file, path in paths.items():
        with safe_open(str(path), framework="pt") as f:
            files.update({key: file for key in f.keys()})
    stray = [key for key in files if ours(key) not in expected]
    if stray:
        raise DraftLoadError(f"{paths[files[stray[0]]]}: tensor {stray[0]} has no place in a {type(target).__name__} "
                             "MTP layer")
    missing = sorted(theirs(k) for k in expected if theirs(k) not in files)
    if missing:
        raise DraftLoadError(f"{name}: the MTP checkpoint lacks {missing}")
    state = read_checked_tensors(paths, files, {ours(key): key for key in files}, expected)
    draft.load_state_dict({k: v.to(draft.fc.weight.dtype) for k, v in state.items()}, strict=True)
    return draft.eval()
