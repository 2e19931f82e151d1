"""Tiny MTP fixtures: an MTP layer made from a target's own last layer, and target checkpoints that carry one in
vLLM's layout (``mtp.*``, Qwen3.5) or transformers' (``layers.{N}.eh_proj`` ..., ``MtpModel``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedModel

from ..drafts.mtp import MtpDraft
from .drafts import language_model

#: the draft's parameter -> its name in each layout (``{k}``: the MTP layer's index; ``{n}``: num_hidden_layers + k)
_VLLM = {"fc.weight": "mtp.fc.weight", "pre_fc_norm_embedding.weight": "mtp.pre_fc_norm_embedding.weight",
         "pre_fc_norm_hidden.weight": "mtp.pre_fc_norm_hidden.weight", "body.norm.weight": "mtp.norm.weight"}
_HF = {"fc.weight": "eh_proj.weight", "pre_fc_norm_embedding.weight": "enorm.weight",
       "pre_fc_norm_hidden.weight": "hnorm.weight", "body.norm.weight": "shared_head.norm.weight"}


def mtp_from_target(target: PreTrainedModel, noise: float = 0.0, seed: int = 0, layers: int = 1,
                    shared: bool = False, copy_layer: int = -1, mlp_layer_types: list[str] | None = None) -> MtpDraft:
    """MTP layers that are each the target's last decoder layer and final norm, ``fc`` passing the normed embedding
    through (the feature half zero): each drafts like a one-layer cut of the target, agreeing in part. ``noise``
    perturbs their matrices (relative to each weight's std; each layer differently); ``shared``: every layer's
    ``fc`` and norms are layer 0's (vLLM's layout stores them once). ``copy_layer``: the target layer copied (of
    the MLP kind ``mlp_layer_types`` gives, where the family has several)."""
    lm = language_model(target)
    draft = MtpDraft.for_target(target, layers, mlp_layer_types=mlp_layer_types)
    hidden = draft.config.text_config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in draft.mtp_layers:
            layer.fc.weight.zero_()
            layer.fc.weight[:, :hidden] = torch.eye(hidden)
            layer.body.layers[0].load_state_dict(lm.layers[copy_layer].state_dict())
            layer.body.norm.load_state_dict(lm.norm.state_dict())
        for p in draft.parameters():
            if noise > 0 and p.dim() > 1:
                p.add_(noise * p.std() * torch.randn(p.shape, generator=gen).to(p))
        for layer in draft.later_layers if shared else ():
            for name in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
                getattr(layer, name).load_state_dict(getattr(draft, name).state_dict())
            layer.body.norm.load_state_dict(draft.body.norm.state_dict())
    return draft.eval()


def _split(name: str) -> tuple[int, str]:
    """A draft parameter's (MTP layer, name within the layer)."""
    if name.startswith("later_layers."):
        _, k, rest = name.split(".", 2)
        return int(k) + 1, rest
    return 0, name


def stored_experts(name: str, tensor: torch.Tensor, experts: str | None) -> dict[str, torch.Tensor]:
    """A decoder layer's tensor ``name`` as a checkpoint stores it: ``experts=None`` as transformers holds it,
    "per_expert" (``mlp.experts.{e}.gate_proj.weight`` ...), "step3p7" (Step3.7's ``moe.*`` / ``share_expert.*``)."""
    if experts is None:
        return {name: tensor}
    fused = name.rsplit("experts.", 1)
    if len(fused) == 2 and fused[1] in ("gate_up_proj", "down_proj"):
        halves = tensor.chunk(2, dim=1) if fused[1] == "gate_up_proj" else (tensor,)
        projs = ("gate_proj", "up_proj") if fused[1] == "gate_up_proj" else ("down_proj",)
        if experts == "step3p7":
            return {f"moe.{proj}.weight": half for proj, half in zip(projs, halves)}
        return {f"{fused[0]}experts.{e}.{proj}.weight": half[e] for proj, half in zip(projs, halves)
                for e in range(half.shape[0])}
    if experts == "step3p7":
        renames = {"mlp.gate.weight": "moe.gate.weight", "mlp.gate.e_score_correction_bias": "moe.router_bias"}
        if name.startswith("mlp.shared_experts."):
            return {"share_expert." + name.removeprefix("mlp.shared_experts."): tensor}
        return {renames.get(name, name): tensor}
    return {name: tensor}


def mtp_tensors(draft: MtpDraft, layout: str, decoder_prefix: str, num_hidden_layers: int,
                experts: str | None = None) -> dict[str, torch.Tensor]:
    """The draft's tensors under the checkpoint names of ``layout`` ("vllm" or "transformers"; the latter's
    layer k as layer ``num_hidden_layers + k`` of the text decoder at ``decoder_prefix``). vLLM's layout keeps
    layer 0's ``fc`` and norms only (shared by every layer). ``experts``: how MoE experts are stored
    (:func:`stored_experts`)."""
    out = {}
    for name, tensor in draft.state_dict().items():
        k, rest = _split(name)
        if layout == "vllm":
            if k and rest in _VLLM:
                continue
            prefix = "" if rest in _VLLM else f"mtp.layers.{k}."
        else:
            prefix = f"{decoder_prefix}layers.{num_hidden_layers + k}."
        if rest in _VLLM:
            names = {(_VLLM if layout == "vllm" else _HF)[rest]: tensor}
        else:
            names = stored_experts(rest.removeprefix("body.layers.0."), tensor, experts)
        out.update({prefix + key: value.detach().clone().contiguous() for key, value in names.items()})
    return out


def write_mtp_checkpoint(target: PreTrainedModel, draft: MtpDraft, folder: str | Path, layout: str = "vllm",
                         count: int | None = 1, count_field: str | None = None,
                         extra_config: dict | None = None, experts: str | None = None,
                         tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """``target`` saved to ``folder`` in shards (an index), its MTP layers ``draft`` in a shard of its own under
    ``layout``'s names, the layer count declared in the text config (``count=None``: not declared; the field:
    ``mtp_num_hidden_layers`` for vLLM's layout, ``num_mtp_layers`` for transformers'; ``extra_config``: further
    text-config fields; ``experts``: how MoE experts are stored, :func:`stored_experts`). ``tensors``: the MTP
    tensors under their checkpoint names, written as they are (``draft`` and ``layout`` unused)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    target.save_pretrained(folder, max_shard_size="200KB")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    if tensors is None:
        table = next(k for k in index["weight_map"] if k.endswith("embed_tokens.weight") and "vision" not in k)
        prefix = table[: -len("embed_tokens.weight")]
        depth = target.config.get_text_config().num_hidden_layers
        tensors = mtp_tensors(draft, layout, prefix, depth, experts)
    save_file(tensors, str(folder / "model-mtp.safetensors"), metadata={"format": "pt"})
    index["weight_map"].update({key: "model-mtp.safetensors" for key in tensors})
    index_path.write_text(json.dumps(index, indent=1))
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if count is not None:
        text = config.get("text_config", config)
        text[count_field or ("mtp_num_hidden_layers" if layout == "vllm" else "num_mtp_layers")] = count
        for field, value in (extra_config or {}).items():
            text[field] = value
    config_path.write_text(json.dumps(config, indent=1))
    return folder
