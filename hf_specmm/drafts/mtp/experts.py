"""MoE tensors of an MTP layer as checkpoints store them, and the fused tensors of transformers' decoder layers.

transformers' MoE decoder layers hold their experts fused: ``mlp.experts.gate_up_proj`` [E, 2I, H] (every
expert's gate rows, then its up rows) and ``mlp.experts.down_proj`` [E, H, I]. Checkpoints store them otherwise,
and transformers converts them at load (its conversion mapping), which an MTP layer read on its own must do too:

- one tensor per expert (Qwen3.5-MoE, Qwen3-Next, DeepSeek-style): ``mlp.experts.{e}.gate_proj`` / ``up_proj`` /
  ``down_proj`` ``.weight``, stacked over e (gate and up then concatenated);
- Step3.7's own names: ``moe.gate_proj.weight`` and ``moe.up_proj.weight`` [E, I, H] (concatenated),
  ``moe.down_proj.weight``, ``moe.gate.weight`` (the router), ``moe.router_bias`` (its score correction) and
  ``share_expert.*`` (the shared expert).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ...errors import DraftLoadError

_STEP3P7 = {"moe.gate.weight": "mlp.gate.weight", "moe.router_bias": "mlp.gate.e_score_correction_bias",
            "moe.down_proj.weight": "mlp.experts.down_proj"}
_STACKED_HALVES = {"moe.gate_proj.weight": 0, "moe.up_proj.weight": 1}
_PER_EXPERT = re.compile(r"^(.*\.)?experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_HALF = {"gate_proj": 0, "up_proj": 1, "down_proj": None}
_PART = "@"  # marks a parameter name as a part: "<name>@<half>:<expert>" (either may be "-")


def layer_name(rest: str) -> str:
    """A decoder layer's parameter name for the checkpoint name ``rest`` (within the layer), or a part of one
    (``<name>@<half>:<expert>``, see :func:`split_part`)."""
    if rest in _STEP3P7:
        return _STEP3P7[rest]
    if rest in _STACKED_HALVES:
        return f"mlp.experts.gate_up_proj{_PART}{_STACKED_HALVES[rest]}:-"
    if rest.startswith("share_expert."):
        return "mlp.shared_experts." + rest.removeprefix("share_expert.")
    match = _PER_EXPERT.match(rest)
    if match is not None:
        prefix, expert, proj = match.groups()
        half = _HALF[proj]
        fused = "gate_up_proj" if half is not None else "down_proj"
        return f"{prefix or ''}experts.{fused}{_PART}{'-' if half is None else half}:{expert}"
    return rest


def split_part(param: str) -> tuple[str, tuple[int | None, int | None] | None]:
    """``(parameter, (half, expert))`` of a part's name, ``(parameter, None)`` of a whole tensor's."""
    if _PART not in param:
        return param, None
    name, part = param.split(_PART)
    half, expert = part.split(":")
    return name, (None if half == "-" else int(half), None if expert == "-" else int(expert))


def read_fused(paths: dict[str, Path], where: dict[str, str], pieces: dict[str, dict[tuple, str]],
               expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each fused parameter of ``pieces`` ({parameter: {(half, expert): checkpoint key}}) assembled from its
    tensors (stacked over experts 0..E-1, then gate and up concatenated), shape-checked against ``expected``."""
    from safetensors import safe_open

    state = {}
    for param, parts in pieces.items():
        tensors = {}
        for part, key in parts.items():
            with safe_open(str(paths[where[key]]), framework="pt") as f:
                tensors[part] = f.get_tensor(key)
        first = next(iter(parts.values()))
        halves = sorted({half for half, _ in parts}, key=lambda h: -1 if h is None else h)
        if halves not in ([None], [0, 1]):
            raise DraftLoadError(f"{paths[where[first]]}: {param} needs both the gate and the up projections; "
                                 f"only {sorted(parts.values())} are stored")
        blocks = []
        for half in halves:
            experts = sorted((e for h, e in parts if h == half), key=lambda e: -1 if e is None else e)
            if experts == [None]:
                blocks.append(tensors[half, None])
            elif experts != list(range(len(experts))):
                raise DraftLoadError(f"{paths[where[first]]}: the experts of {param} are {experts}, not 0 .. "
                                     f"{len(experts) - 1} ({first} ...)")
            else:
                blocks.append(torch.stack([tensors[half, e] for e in experts]))
        fused = blocks[0] if len(blocks) == 1 else torch.cat(blocks, 1)
        if list(fused.shape) != list(expected[param].shape):
            raise DraftLoadError(f"{paths[where[first]]}: tensors {sorted(parts.values())[:3]} ... make {param} of "
                                 f"shape {list(fused.shape)}; the draft needs {list(expected[param].shape)}")
        state[param] = fused
    return state
