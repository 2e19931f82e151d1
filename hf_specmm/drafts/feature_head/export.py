"""EAGLE-3 heads written in the serving engines' layouts (``speculators``, SGLang): see :mod:`.formats` for both
layouts and their import. Export sits below :mod:`.eagle3` (whose ``save_pretrained`` calls it) and knows the head
only through its config (:mod:`.eagle3_config`) and state dict, so the head's module imports it, never the other way
round."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from .configuration import default_aux_layers
from .validation import NORM_FLAGS

if TYPE_CHECKING:
    from .eagle3_config import Eagle3HeadConfig

FORMATS = ("speculators", "sglang")
SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"


# ---- names ----------------------------------------------------------------------------------------------
def _speculators_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {re.sub(r"^body\.layers\.", "layers.", k): v for k, v in state.items()}


def _sglang_name(name: str) -> str:
    match = re.match(r"^body\.layers\.(\d+)\.(.*)$", name)
    if match is None:
        return name
    index, rest = int(match.group(1)), match.group(2)
    if index == 0:
        return f"midlayer.{rest}"
    return f"additional_layers.{index - 1}.{'hidden_norm' + rest[len('input_layernorm'):] if rest.startswith('input_layernorm') else rest}"


# ---- export ---------------------------------------------------------------------------------------------
def _mrope_section(config: Eagle3HeadConfig) -> list[int] | None:
    rope = getattr(config.text_config, "rope_parameters", None) or {}
    return list(rope["mrope_section"]) if isinstance(rope, dict) and "mrope_section" in rope else None


def _layer_dict(config: Eagle3HeadConfig) -> dict[str, Any]:
    layer = copy.deepcopy(config.layer_config).to_dict()
    for key in ("_attn_implementation_autoset", "transformers_version", "architectures", "dtype", "torch_dtype"):
        layer.pop(key, None)
    rope = dict(layer.get("rope_parameters") or {})
    section = _mrope_section(config)
    if section is not None:  # the engines read M-RoPE from the layer config's rope_scaling
        rope["mrope_section"] = section
    layer["rope_parameters"] = rope
    layer["rope_scaling"] = {**rope, "rope_type": "default"} if section is not None else None
    layer["rope_theta"] = rope.get("rope_theta", 10000.0)
    layer["model_type"] = "llama"
    return layer


def export_head(config: Eagle3HeadConfig, state_dict: dict[str, torch.Tensor], save_directory: str | Path,
                layout: str) -> Path:
    """Write the head of ``config`` and ``state_dict`` in ``layout`` (``"speculators"`` or ``"sglang"``):
    config.json + model.safetensors."""
    if layout not in FORMATS:
        raise ValueError(f"format={layout!r}: choose from hf_specmm, {', '.join(FORMATS)}")
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    layer = _layer_dict(config)
    if layout == "speculators":
        tensors = _speculators_names(state)
        out: dict[str, Any] = {
            "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": layer, "draft_vocab_size": config.draft_vocab_size,
            "norm_before_residual": config.norm_before_residual, "target_hidden_size": None,
            **{flag: getattr(config, flag) for flag in NORM_FLAGS},
            "eagle_aux_hidden_state_layer_ids": list(config.aux_layers),
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                "verifier": {"name_or_path": config.target, "architectures": [config.target_class] if config.target_class else []}},
        }
    else:
        used = [flag for flag in ("norm_before_residual", *NORM_FLAGS) if getattr(config, flag)]
        if used:
            raise ValueError(f"SGLang's LlamaForCausalLMEagle3 has no {', '.join(used)}: export this head with "
                             "format='speculators'")
        tensors = {_sglang_name(k): v for k, v in state.items()}
        out = {**layer, "architectures": [SGLANG_ARCHITECTURE], "draft_vocab_size": config.draft_vocab_size,
               "tie_word_embeddings": False}
        if config.target_num_layers is None or list(config.aux_layers) != default_aux_layers(config.target_num_layers) \
                or config.target_num_layers < 8:
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [k - 1 for k in config.aux_layers],
                                   "use_aux_hidden_state": True}
    out["hf_specmm"] = {"target": config.target, "target_class": config.target_class,
                        "target_num_layers": config.target_num_layers,
                        **{k: v for k, v in (getattr(config, "hf_specmm", None) or {}).items() if k == "results"}}
    (folder / "config.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
