"""vLLM ``speculators``' ``dflash`` checkpoint layout, read and written as data (no checkpoint code runs).

The layout (speculators ``DFlashSpeculatorConfig`` / ``DFlashDraftModel``): ``config.json`` with
``speculators_model_type: "dflash"``, a Qwen3 ``transformer_layer_config`` for the draft layers, ``block_size``,
``mask_token_id``, ``aux_hidden_state_layer_ids`` (indices into the verifier's ``hidden_states``: layer i's
output is index i + 1, so they are our ``target_layer_ids`` + 1), ``draft_vocab_size``, ``sample_from_anchor``,
``sliding_window_non_causal`` and ``speculators_config``; weights ``layers.*`` (the same modules and names as
``MuseGlimmerAssistantModel``'s), ``fc`` / ``hidden_norm`` (our ``encoder.fc`` / ``encoder.output_norm_enc``),
``norm``, and the verifier's frozen ``lm_head`` (``embed_tokens``, ``verifier_*``, ``d2t`` / ``t2d`` may be
absent). What our drafter cannot reproduce exactly is refused before any forward, naming the field.
``hf_specmm.load_draft(path)`` reads such a folder through :func:`load_speculators_dflash` (the kind's ``imports``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ...errors import DraftLoadError, IncompatibleDraftError
from ..checkpoints import read_config_json, weight_files
from ..feature_head.validation import check_vocab_maps
from .extended import SpeculatorsDFlashModel, needs_extension
from .modeling import DFLASH_CLASSES, check_target

_RENAMES = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
#: a reduced draft vocabulary's own tensors (extended.SpeculatorsDFlashModel's names are speculators')
_DRAFT_VOCAB = ("lm_head.weight", "d2t", "t2d")
#: weights of the layout our drafter takes from its target instead (the embedding, LM heads, vocabulary maps)
_FROM_TARGET = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight", "d2t", "t2d")
_LAYER_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "rms_norm_eps", "max_position_embeddings", "sliding_window", "layer_types", "hidden_act")


def is_speculators_dflash(config: dict) -> bool:
    """Whether a checkpoint's ``config.json`` (as a dict) is speculators' ``dflash`` layout."""
    return config.get("speculators_model_type") == "dflash"


def _refuse(path: Any, why: str) -> None:
    raise IncompatibleDraftError(f"The speculators dflash checkpoint {path} {why}")


def _draft_config(config: dict, path: Any) -> Any:
    layer = config.get("transformer_layer_config") or {}
    if not isinstance(layer, dict):
        raise DraftLoadError(f"{path}: config.json's transformer_layer_config must be a JSON object, got {layer!r}")
    if config.get("sample_from_anchor"):
        _refuse(path, "has sample_from_anchor=True (it also proposes at the anchor position: block_size drafts); "
                      "transformers' DFlash drafters propose block_size - 1, after the anchor.")
    vocab, draft_vocab = layer.get("vocab_size"), config.get("draft_vocab_size")
    if draft_vocab is not None and vocab is not None and not 0 < int(draft_vocab) <= int(vocab):
        _refuse(path, f"has draft_vocab_size={draft_vocab}, not in 1..{vocab} (its transformer_layer_config's "
                      "vocab_size, the verifier's).")
    missing = [k for k in ("block_size", "mask_token_id", "aux_hidden_state_layer_ids") if config.get(k) is None]
    if missing:
        _refuse(path, f"has no {', '.join(missing)} in its config.json.")
    rope = dict(layer.get("rope_parameters") or {"rope_type": "default"})
    rope.setdefault("rope_theta", layer.get("rope_theta", 10000.0))
    rope.setdefault("rope_type", "default")
    fields = {k: layer[k] for k in _LAYER_FIELDS if layer.get(k) is not None}
    if "layer_types" not in fields or "sliding_window" not in fields:  # speculators: no window, every layer full
        fields["layer_types"] = ["full_attention"] * fields.get("num_hidden_layers", 1)
    extra: dict[str, Any] = {}  # what speculators' layout adds (extended.py): only where it differs from stock's class
    if layer.get("attention_bias"):
        extra["attention_bias"] = True
    if draft_vocab is not None and int(draft_vocab) != int(vocab):
        extra.update(draft_vocab_size=int(draft_vocab), vocab_size=int(vocab))
    if "sliding_attention" in fields["layer_types"]:  # speculators' window (from the anchor), its causality flag
        extra.update(window_from_anchor=True, sliding_window_non_causal=bool(config.get("sliding_window_non_causal")))
    return DFLASH_CLASSES[0].config_class(
        **fields, rope_parameters=rope, block_size=int(config["block_size"]), mask_token_id=int(config["mask_token_id"]),
        target_layer_ids=[int(i) - 1 for i in config["aux_hidden_state_layer_ids"]],
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)


def load_speculators_dflash(path: str | Path, target: Any = None, name: str | None = None) -> Any:
    """A ``MuseGlimmerAssistantModel`` from a local speculators ``dflash`` folder (strict: a missing or unknown
    weight is a :class:`~hf_specmm.errors.DraftLoadError`; checked against ``target`` when given). ``name``: how
    errors name the checkpoint (default: the folder)."""
    folder = Path(path)
    where = name or str(folder)
    config = read_config_json(folder / "config.json")
    if not is_speculators_dflash(config):
        raise DraftLoadError(f"{where} is not a speculators dflash checkpoint (speculators_model_type "
                             f"{config.get('speculators_model_type')!r})")
    draft_config = _draft_config(config, where)
    cls = SpeculatorsDFlashModel if needs_extension(draft_config) else DFLASH_CLASSES[0]
    if target is not None:  # what the config declares against the target, laid out on meta: nothing allocated yet
        with torch.device("meta"):
            check_target(target, cls(draft_config))
    weights: dict[str, torch.Tensor] = {}
    for file in weight_files(folder, f"speculators dflash checkpoint {where}"):
        weights.update(load_file(file))
    reduced = getattr(draft_config, "draft_vocab_size", None) is not None
    if reduced:  # its own head and maps: speculators writes them for a reduced vocabulary (they may be left out)
        absent = [k for k in _DRAFT_VOCAB if k not in weights]
        if absent:
            _refuse(where, "proposes from a reduced draft vocabulary "
                           f"(draft_vocab_size={draft_config.draft_vocab_size}) but holds no {', '.join(absent)}: without its draft-to-target map (d2t) its draft ids "
                           "cannot be served; save it with its vocabulary maps.")
    own = _DRAFT_VOCAB if reduced else ()
    state = {_RENAMES.get(k, k): v for k, v in weights.items() if k not in _FROM_TARGET or k in own}
    fc = state.get("encoder.fc.weight")
    if fc is not None and fc.shape[1] != len(draft_config.target_layer_ids) * draft_config.hidden_size:
        _refuse(where, f"fuses {fc.shape[1] // draft_config.hidden_size} target layers but lists "
                        f"{len(draft_config.target_layer_ids)} in aux_hidden_state_layer_ids (the verifier's last layer "
                        "implied, as speculators' converter leaves it); list every layer it reads.")
    model = cls(draft_config)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise DraftLoadError(f"speculators dflash checkpoint {where}: missing weights {missing}, unexpected {unexpected}")
    model.load_state_dict(state, strict=True)
    if reduced:
        check_vocab_maps(model.d2t, model.t2d, f"speculators dflash checkpoint {where}",
                         vocab=int(draft_config.vocab_size))
    head = None if reduced else weights.get("lm_head.weight")
    if target is not None:
        check_target(target, model)
        rows = target.get_output_embeddings().weight
        if head is not None and (head.shape != rows.shape or not torch.equal(head.to(rows), rows)):
            raise IncompatibleDraftError(f"The speculators dflash checkpoint {where} carries another verifier's LM head "
                                         f"({tuple(head.shape)}) than {type(target).__name__}'s ({tuple(rows.shape)}).")
    return model.eval()


def save_speculators_dflash(draft: Any, path: str | Path, target: Any, verifier: str | None = None) -> Path:
    """Write ``draft`` (a DFlash drafter for ``target``) in speculators' ``dflash`` layout: its layers (with their
    biases where ``attention_bias``), ``fc`` / ``hidden_norm`` / ``norm``, and the target's LM head as the frozen
    ``lm_head`` (a reduced draft vocabulary: its own ``lm_head``, ``d2t`` and ``t2d``). ``verifier``: the target's
    name or path recorded in ``speculators_config``."""
    check_target(target, draft)
    config, text = draft.config, target.config.get_text_config()
    if text.num_hidden_layers - 1 in config.target_layer_ids:
        raise IncompatibleDraftError(f"The DFlash drafter reads the target's last layer ({text.num_hidden_layers - 1}), "
                                     "which speculators' dflash layout leaves implied (its converter drops it from "
                                     "aux_hidden_state_layer_ids); it cannot be written there unambiguously.")
    if "sliding_attention" in config.layer_types and not getattr(config, "window_from_anchor", False):
        raise IncompatibleDraftError("The DFlash drafter has sliding-window layers windowed per query (transformers' "
                                     "window); speculators' dflash layout windows every block from its anchor, so it "
                                     "would draft differently there: export a drafter with full-attention layers.")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    inverse = {v: k for k, v in _RENAMES.items()}
    state = {inverse.get(k, k): v.detach().contiguous().cpu() for k, v in draft.state_dict().items()}
    vocab = int(target.get_output_embeddings().weight.shape[0])
    if getattr(draft, "d2t", None) is None:
        state["lm_head.weight"] = target.get_output_embeddings().weight.detach().contiguous().cpu()
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    layer = {k: getattr(config, k) for k in _LAYER_FIELDS}
    layer.update(model_type="qwen3", vocab_size=vocab, attention_bias=bool(getattr(config, "attention_bias", False)),
                 rope_parameters=dict(config.rope_parameters))
    document = {
        "speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"],
        "transformer_layer_config": layer, "draft_vocab_size": int(state["lm_head.weight"].shape[0]),
        "block_size": config.block_size, "target_hidden_size": text.hidden_size,
        "aux_hidden_state_layer_ids": [i + 1 for i in config.target_layer_ids], "mask_token_id": config.mask_token_id,
        "sliding_window_non_causal": bool(getattr(config, "sliding_window_non_causal", True)),
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": config.block_size - 1}],
            "verifier": {"name_or_path": verifier or getattr(target, "name_or_path", None),
                         "architectures": list(getattr(target.config, "architectures", None) or [type(target).__name__])},
        },
    }
    (folder / "config.json").write_text(json.dumps(document, indent=2, sort_keys=True))
    return folder
