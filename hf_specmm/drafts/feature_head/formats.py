"""EAGLE-3 checkpoints in the serving engines' layouts: export and import of :class:`~.eagle3.Eagle3FeatureHead`.

Two published layouts hold the same tensors under different names:

- ``speculators`` (vLLM's ``--speculative-config '{"method": "eagle3", "model": PATH}'``, RedHatAI drafts):
  ``config.json`` with ``speculators_model_type: "eagle3"``, ``transformer_layer_config`` (a Llama config;
  its ``vocab_size`` is the target's), ``draft_vocab_size``, ``norm_before_residual``,
  ``eagle_aux_hidden_state_layer_ids`` (index k = the input of target layer k) and ``speculators_config``
  (algorithm, proposal methods, verifier), and the norm options of ``speculators`` 0.9 (``norm_before_fc``,
  ``fc_norm``, ``norm_output``: see :mod:`.eagle3`); tensors ``fc.weight``, ``layers.<i>.*``, ``norm.weight``,
  ``lm_head.weight``, ``d2t`` (int64 [Vd], target id = draft id + d2t) and ``t2d`` (bool [V]), plus
  ``input_norm.weight`` (``norm_before_fc``) or ``fc_norm.<i>.weight`` (``fc_norm``, one per captured layer).
- SGLang / SpecForge's ``LlamaForCausalLMEagle3``: a flat Llama ``config.json`` (``architectures``,
  ``draft_vocab_size``, ``rope_scaling`` with ``mrope_section`` for Qwen-VL targets, optional
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` counted as *outputs* of layer k, i.e. ours - 1);
  tensors ``midlayer.*`` (the first layer), ``additional_layers.<i-1>.*`` (layers after it: their pre-attention
  norm is ``hidden_norm``), ``fc.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``; none of the
  norm options above (a head that uses one is exported to ``speculators`` only).

Import reads ``config.json`` as JSON data (an ``auto_map`` pointing at the checkpoint's own Python files is
never followed) and tensors from safetensors only; the head is checked against the target (hidden size,
vocabulary, layer count) before anything runs.

    >>> head.save_pretrained("draft-speculators", format="speculators")  # doctest: +SKIP
    >>> again = hf_specmm.load_draft("draft-speculators", target=model)  # doctest: +SKIP
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import PreTrainedModel

from ...errors import DraftLoadError, IncompatibleDraftError
from ..checkpoints import read_config_json, weight_files
from .eagle3 import Eagle3FeatureHead
from .eagle3_config import Eagle3HeadConfig
from .export import FORMATS, SGLANG_ARCHITECTURE, export_head  # noqa: F401  (export_head: the layouts' writer)
from .modeling import head_config_fields
from .validation import NORM_FLAGS, check_engine_config, check_tensor_shapes, check_vocab_maps, too_few_aux_layers

# the tensors a flag adds, as speculators names them (a key flagged but absent, or present unflagged, is refused)
_FLAG_TENSORS = {"norm_before_fc": r"^input_norm\.", "fc_norm": r"^fc_norm\."}


def checkpoint_format(config: dict[str, Any]) -> str | None:
    """``"speculators"`` / ``"sglang"`` for an EAGLE-3 checkpoint's config.json (as data), else None."""
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    if SGLANG_ARCHITECTURE in (config.get("architectures") or []):
        return "sglang"
    return None


# ---- names ----------------------------------------------------------------------------------------------
def _ours_from(name: str, layout: str) -> str:
    if layout == "speculators":
        return re.sub(r"^layers\.", "body.layers.", name)
    if name.startswith("midlayer."):
        return "body.layers.0." + name[len("midlayer."):]
    match = re.match(r"^additional_layers\.(\d+)\.(.*)$", name)
    if match is None:
        return name
    rest = match.group(2)
    rest = "input_layernorm" + rest[len("hidden_norm"):] if rest.startswith("hidden_norm") else rest
    return f"body.layers.{int(match.group(1)) + 1}.{rest}"



# ---- import ---------------------------------------------------------------------------------------------
def _read_tensors(folder: Path, source: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and, per tensor, the file it came from (a tensor in two files is refused)."""
    tensors: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for path in weight_files(folder, source):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                if key in tensors:
                    raise DraftLoadError(f"{source}: tensor {key} is in both {origin[key]} and {path.name}")
                tensors[key], origin[key] = f.get_tensor(key), path.name
    return tensors, origin


def _check_shapes(name: str, layer: dict[str, Any], draft_vocab: int, aux: list[int], target: PreTrainedModel) -> None:
    """The checkpoint against ``target`` (hidden size, vocabulary, layers), before any weight is read."""
    text = target.config.get_text_config()
    vocab = int(target.get_input_embeddings().weight.shape[0])
    depth = int(text.num_hidden_layers)
    problems = []
    if int(layer["hidden_size"]) != int(text.hidden_size):
        problems.append(f"hidden size {layer['hidden_size']} (the target's is {text.hidden_size})")
    if int(layer["vocab_size"]) != vocab:
        problems.append(f"target vocabulary of {layer['vocab_size']} ids (the target has {vocab})")
    if not 1 <= draft_vocab <= int(layer["vocab_size"]):
        problems.append(f"draft_vocab_size {draft_vocab} (must be 1..{layer['vocab_size']})")
    if not aux or min(aux) < 0 or max(aux) > depth:
        problems.append(f"auxiliary layers {aux} (the target has {depth} decoder layers: inputs 0..{depth})")
    if problems:
        raise IncompatibleDraftError(f"The EAGLE-3 checkpoint {name} was made for another target than this "
                                     f"{type(target).__name__}: its " + "; its ".join(problems) + ".")


def _check_flag_tensors(flags: dict[str, bool], tensors: dict[str, torch.Tensor], name: str) -> None:
    """The norms a flag adds are in the weights exactly when config.json sets it (before any weight is used)."""
    for flag, pattern in _FLAG_TENSORS.items():
        keys = sorted(k for k in tensors if re.match(pattern, k))
        if flags[flag] and not keys:
            wanted = "input_norm.weight" if flag == "norm_before_fc" else "fc_norm.<i>.weight (one per captured layer)"
            raise DraftLoadError(f"{name}: config.json sets {flag}=true, but the weights hold no {wanted}")
        if keys and not flags[flag]:
            raise DraftLoadError(f"{name}: the weights hold {keys}, which only {flag}=true uses, but config.json does "
                                 f"not set {flag}: a checkpoint whose config and weights disagree is not guessed at")


def import_head(folder: str | Path, target: PreTrainedModel | None, name: str | None = None) -> Eagle3FeatureHead:
    """Read a ``speculators`` or SGLang EAGLE-3 checkpoint folder as an :class:`Eagle3FeatureHead` for
    ``target`` (strict: every tensor used, none missing; the target's embedding, if stored, must be the
    target's)."""
    folder = Path(folder)
    name = name or str(folder)
    raw = read_config_json(folder / "config.json")
    if raw.get("speculators_model_type") not in (None, "eagle3"):
        raise DraftLoadError(f"{name} is a speculators {raw['speculators_model_type']!r} checkpoint, not an EAGLE-3 "
                             "one (speculators_model_type 'eagle3'): load it with hf_specmm.load_draft(path)")
    layout = checkpoint_format(raw)
    if layout is None:
        raise DraftLoadError(f"{name}: config.json is neither a speculators nor an SGLang EAGLE-3 config")
    if target is None:
        raise DraftLoadError(f"{name} is an EAGLE-3 draft in the {layout} layout: it reads its target's hidden states "
                             "and embedding, so load it with its target: hf_specmm.load_draft(path, target=model)")
    check_engine_config(raw, layout, f"{folder / 'config.json'}")
    flags = {flag: bool(raw.get(flag)) for flag in NORM_FLAGS}
    depth = int(target.config.get_text_config().num_hidden_layers)
    if layout == "speculators":
        if flags["norm_before_fc"] and flags["fc_norm"]:
            raise DraftLoadError(f"{name}: config.json sets both norm_before_fc and fc_norm, which speculators refuses "
                                 "too (one norm over the fused features, or one per captured layer)")
        if raw.get("target_hidden_size") not in (None, raw["transformer_layer_config"].get("hidden_size")):
            raise DraftLoadError(f"{name} uses target_hidden_size={raw['target_hidden_size']} (a target of another width "
                                 "than the head), which hf_specmm's EAGLE-3 head does not implement")
        layer = dict(raw["transformer_layer_config"])
        aux = raw.get("eagle_aux_hidden_state_layer_ids")
        norm_before_residual = bool(raw.get("norm_before_residual", False))
    else:
        layer = {k: v for k, v in raw.items() if k not in ("architectures", "draft_vocab_size", "eagle_config", "hf_specmm")}
        ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        aux = None if ids is None else [int(k) + 1 for k in ids]  # SGLang counts layer outputs
        norm_before_residual = False
        used = [flag for flag, on in flags.items() if on]
        if used:  # SGLang's LlamaForCausalLMEagle3 defines none of them: not read as speculators' without evidence
            raise DraftLoadError(f"{name}: an SGLang EAGLE-3 config with {used}, which hf_specmm reads from the "
                                 "speculators layout only (speculators_model_type 'eagle3')")
    aux = [int(k) for k in aux] if aux is not None else [2, depth // 2, depth - 3]  # the engines' default
    draft_vocab = int(raw.get("draft_vocab_size") or layer["vocab_size"])
    if too_few_aux_layers(aux):
        raise DraftLoadError(f"{name} ({layout} layout): {too_few_aux_layers(aux)}")
    _check_shapes(name, layer, draft_vocab, aux, target)
    read, origin = _read_tensors(folder, name)
    tensors = {_ours_from(k, layout): v for k, v in read.items()}
    files = {_ours_from(k, layout): f"{f} ({k})" for k, f in origin.items()}
    _check_flag_tensors(flags, tensors, f"{name} ({layout} layout)")
    stored_embed = tensors.pop("embed_tokens.weight", None)
    if stored_embed is not None:
        own = target.get_input_embeddings().weight
        if stored_embed.shape != own.shape or not torch.allclose(stored_embed.float(), own.detach().float().cpu(),
                                                                 rtol=1e-2, atol=1e-3):
            raise IncompatibleDraftError(f"{name} stores a token embedding that is not this target's; the head reads "
                                         "the target's embedding (and its hidden states): use it with its own target")
    layer_fields = dict(layer)
    fields = head_config_fields(target, int(layer["num_hidden_layers"]), raw.get("hf_specmm", {}).get("target") or name)
    fields["target_fingerprint"] = None  # shapes were checked; the engines' checkpoints record no fingerprint
    if isinstance(fields["text_config"].get("layer_types"), list):
        fields["text_config"]["layer_types"] = ["full_attention"] * int(layer["num_hidden_layers"])
    layer_fields.pop("rope_scaling", None)
    rope = dict(layer_fields.get("rope_parameters") or {"rope_type": "default",
                                                          "rope_theta": layer_fields.get("rope_theta", 10000.0)})
    layer_fields["rope_parameters"] = {k: v for k, v in rope.items() if not k.startswith("mrope") and k != "type"}
    layer_fields["rope_parameters"].setdefault("rope_type", "default")
    config = Eagle3HeadConfig(layer_config=layer_fields, aux_layers=aux, draft_vocab_size=draft_vocab,
                              norm_before_residual=norm_before_residual, **flags,
                              target_num_layers=(raw.get("hf_specmm") or {}).get("target_num_layers"), **fields)
    head = Eagle3FeatureHead(config)
    if "d2t" not in tensors and draft_vocab == int(layer["vocab_size"]):  # a full-vocabulary head may omit the maps
        tensors.update(d2t=head.d2t.clone(), t2d=torch.ones_like(head.t2d))
    check_tensor_shapes({k: v.shape for k, v in head.state_dict().items()},
                        {k: (v.shape, files.get(k, "the defaults")) for k, v in tensors.items()}, f"{name} ({layout} layout)")
    check_vocab_maps(tensors["d2t"], tensors["t2d"], f"{name} ({layout} layout)", vocab=int(layer["vocab_size"]))
    head.load_state_dict({k: v.to(head.state_dict()[k].dtype) for k, v in tensors.items()}, strict=True)
    return head.to_target_device(target)
