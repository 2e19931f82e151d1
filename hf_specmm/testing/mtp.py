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


def mtp_from_target(target: PreTrainedModel, noise: float = 0.0, seed: int = 0) -> MtpDraft:
    """An MTP layer that is the target's last decoder layer and final norm, its ``fc`` passing the normed embedding
    through (the feature half zero): it drafts like a one-layer cut of the target, agreeing in part. ``noise``
    perturbs its matrices (relative to each weight's std)."""
    lm = language_model(target)
    draft = MtpDraft.for_target(target)
    hidden = draft.config.text_config.hidden_size
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, :hidden] = torch.eye(hidden)
        draft.body.layers[0].load_state_dict(lm.layers[-1].state_dict())
        draft.body.norm.load_state_dict(lm.norm.state_dict())
        gen = torch.Generator().manual_seed(seed)
        for p in draft.parameters():
            if noise > 0 and p.dim() > 1:
                p.add_(noise * p.std() * torch.randn(p.shape, generator=gen).to(p))
    return draft.eval()


def mtp_tensors(draft: MtpDraft, layout: str, decoder_prefix: str, num_hidden_layers: int) -> dict[str, torch.Tensor]:
    """The draft's tensors under the checkpoint names of ``layout`` ("vllm" or "transformers"; the latter's
    layer ``num_hidden_layers`` of the text decoder at ``decoder_prefix``)."""
    out = {}
    for name, tensor in draft.state_dict().items():
        if layout == "vllm":
            key = _VLLM.get(name) or "mtp." + name.removeprefix("body.")
        else:
            rest = _HF.get(name) or name.removeprefix("body.layers.0.")
            key = f"{decoder_prefix}layers.{num_hidden_layers}.{rest}"
        out[key] = tensor.detach().clone().contiguous()
    return out


def write_mtp_checkpoint(target: PreTrainedModel, draft: MtpDraft, folder: str | Path, layout: str = "vllm",
                         count: int | None = 1, count_field: str | None = None) -> Path:
    """``target`` saved to ``folder`` in shards (an index), its MTP layer ``draft`` in a shard of its own under
    ``layout``'s names, the layer count declared in the text config (``count=None``: not declared; the field:
    ``mtp_num_hidden_layers`` for vLLM's layout, ``num_mtp_layers`` for transformers')."""
    from safetensors.torch import save_file

    folder = Path(folder)
    target.save_pretrained(folder, max_shard_size="200KB")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    table = next(k for k in index["weight_map"] if k.endswith("embed_tokens.weight") and "vision" not in k)
    prefix = table[: -len("embed_tokens.weight")]
    depth = target.config.get_text_config().num_hidden_layers
    tensors = mtp_tensors(draft, layout, prefix, depth)
    save_file(tensors, str(folder / "model-mtp.safetensors"), metadata={"format": "pt"})
    index["weight_map"].update({key: "model-mtp.safetensors" for key in tensors})
    index_path.write_text(json.dumps(index, indent=1))
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if count is not None:
        text = config.get("text_config", config)
        text[count_field or ("mtp_num_hidden_layers" if layout == "vllm" else "num_mtp_layers")] = count
    config_path.write_text(json.dumps(config, indent=1))
    return folder
