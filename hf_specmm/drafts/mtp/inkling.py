"""Inkling's MTP tensors as its checkpoints store them, read into an :class:`~.modeling.MtpDraft`.

An Inkling checkpoint keeps its MTP layers beside the model, which transformers skips at load
(``_keys_to_ignore_on_load_unexpected = ["model\\.mtp\\..*"]``) and its ``MtpModel`` reads: MTP layer k is
``model.mtp.layers.{k}.input_proj`` (the fc over ``[hidden_norm(h); embed_norm(emb)]``), ``embed_norm``,
``hidden_norm`` and the decoder block under ``transformer_block.``; ``model.mtp.chain_norm`` is the one norm
every layer's output goes through when ``chain_hidden_post_norm`` is set. The block's tensors carry the
checkpoint's own names (``attn.wq_du``, ``attn_norm``, ``mlp.w13_dn`` ...), which transformers renames at load
(its ``inkling_mm_model`` conversion mapping); here they are renamed the same way, and ``mlp.w13_dn`` (the dense
MLP's gate and up rows interleaved) split into ``gate_proj`` / ``up_proj``. Names already in transformers' form
are read as they are.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ...errors import DraftLoadError

LAYOUT = "inkling"
CHAIN_NORM = "model.mtp.chain_norm.weight"  #: shared by every MTP layer
TABLE = "model.llm.embed.weight"  #: the target's token table (its first row ties the checkpoint to the target)
_LAYER = re.compile(r"^model\.mtp\.layers\.(\d+)\.(.+)$")
_INPUTS = {"input_proj.weight": "fc.weight", "embed_norm.weight": "pre_fc_norm_embedding.weight",
           "hidden_norm.weight": "pre_fc_norm_hidden.weight"}
_BLOCK = "transformer_block."
# the checkpoint's names of a decoder block's tensors -> transformers': whole names, then prefixes
_NAMES = {"attn.k_sconv.weight": "self_attn.k_sconv.conv1d.weight",
          "attn.v_sconv.weight": "self_attn.v_sconv.conv1d.weight",
          "attn_sconv.weight": "attn_sconv.conv1d.weight", "mlp_sconv.weight": "mlp_sconv.conv1d.weight"}
_PREFIXES = (("attn.wq_du.", "self_attn.q_proj."), ("attn.wk_dv.", "self_attn.k_proj."),
             ("attn.wv_dv.", "self_attn.v_proj."), ("attn.wr_du.", "self_attn.r_proj."),
             ("attn.wo_ud.", "self_attn.o_proj."), ("attn.", "self_attn."), ("attn_norm.", "input_layernorm."),
             ("mlp_norm.", "post_attention_layernorm."), ("mlp.w2_md.", "mlp.down_proj."))
_INTERLEAVED = "mlp.w13_dn.weight"  # rows gate_0, up_0, gate_1, up_1, ...
_HALVES = ("mlp.gate_proj.weight", "mlp.up_proj.weight")


def block_name(rest: str) -> str:
    """transformers' name of the decoder block's tensor the checkpoint names ``rest`` (within the block)."""
    if rest in _NAMES:
        return _NAMES[rest]
    for stored, name in _PREFIXES:
        if rest.startswith(stored):
            return name + rest[len(stored):]
    return rest


def classify(key: str) -> tuple[int, str] | None:
    """``(MTP layer, name within the layer)`` of an Inkling MTP tensor (the layer's ``body.layers.0.*``, its ``fc``
    and input norms; ``body.norm.weight`` for the chain norm, layer 0's), or None for any other key."""
    if key == CHAIN_NORM:
        return 0, "body.norm.weight"
    match = _LAYER.match(key)
    if match is None:
        return None
    layer, rest = int(match.group(1)), match.group(2)
    if rest in _INPUTS:
        return layer, _INPUTS[rest]
    return layer, "body.layers.0." + block_name(rest.removeprefix(_BLOCK))


def halves(param: str) -> tuple[str, str] | None:
    """The draft's gate and up parameters one stored interleaved tensor (named ``param`` in the draft) holds."""
    if not param.endswith(_INTERLEAVED):
        return None
    stem = param[: -len(_INTERLEAVED)]
    return stem + _HALVES[0], stem + _HALVES[1]


def read_interleaved(paths: dict[str, Path], where: dict[str, str], stored: dict[str, tuple[str, str]],
                     expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The gate and up halves of each interleaved tensor of ``stored`` ({key: (gate param, up param)}),
    shape-checked against ``expected`` before any is used."""
    from safetensors import safe_open

    state = {}
    for key, (gate, up) in stored.items():
        path = paths[where[key]]
        want = [2 * expected[gate].shape[0], *expected[gate].shape[1:]]
        with safe_open(str(path), framework="pt") as f:
            shape = list(f.get_slice(key).get_shape())
            if shape != want or list(expected[up].shape) != list(expected[gate].shape):
                raise DraftLoadError(f"{path}: tensor {key} has shape {shape}; the draft needs {want} (its {gate} and "
                                     f"{up}, rows interleaved)")
            tensor = f.get_tensor(key)
        state[gate], state[up] = tensor[0::2], tensor[1::2]
    return state
