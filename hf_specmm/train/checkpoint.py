"""Checkpoints: draft weights, optimizer, scheduler, RNG states, step counters, sampler state and the
config hash, written atomically (a temporary folder renamed into place once complete), so a run killed
at any moment leaves the previous checkpoint intact and readable.

Layout: ``<output_dir>/checkpoints/step-000120/{model.safetensors, optimizer.pt, scheduler.pt, rng.pt,
trainer_state.json}``; ``trainer_state.json`` is written last and marks a complete checkpoint.

    >>> path = latest_checkpoint("runs/d1")  # doctest: +SKIP
    >>> state = read_state(path)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from .config import TrainingInputError, diff_fields

_NAME = re.compile(r"step-(\d+)")
STATE_FILE = "trainer_state.json"


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def checkpoint_path(output_dir: str | Path, global_step: int) -> Path:
    return checkpoint_root(output_dir) / f"step-{global_step:06d}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step (unfinished temporary folders are ignored)."""
    root = checkpoint_root(output_dir)
    found = [(int(m.group(1)), p) for p in root.glob("step-*") if (m := _NAME.fullmatch(p.name))
             and (p / STATE_FILE).is_file()] if root.is_dir() else []
    return max(found)[1] if found else None


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write(folder: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any, state: dict[str, Any]) -> None:
    save_model(model, str(folder / "model.safetensors"))  # handles tied weights
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    torch.save(rng_state(), folder / "rng.pt")
    (folder / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))


def save_checkpoint(output_dir: str | Path, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                    state: dict[str, Any], keep: int) -> Path:
    """Write ``step-<global_step>`` atomically, then keep only the ``keep`` newest checkpoints."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(output_dir, state["global_step"])
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    _write(tmp, model, optimizer, scheduler, state)
    for f in tmp.iterdir():  # data on disk before the rename makes it visible
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # the same step written again (a rerun): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    for stale in root.glob(".tmp-*"):  # leftovers of runs killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    done = sorted(((int(m.group(1)), p) for p in root.glob("step-*") if (m := _NAME.fullmatch(p.name))), reverse=True)
    for _, old in done[keep:]:
        shutil.rmtree(old)
    return final


def read_state(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise TrainingInputError(f"{path} is not a complete hf_specmm training checkpoint (no {STATE_FILE})")
    return json.loads((path / STATE_FILE).read_text())


def check_compatible(state: dict[str, Any], fields: dict[str, Any], config_hash: str, path: Path) -> None:
    """Refuse a checkpoint written by another configuration, naming the fields that differ."""
    if state.get("config_hash") == config_hash:
        return
    diffs = diff_fields(state.get("config_fields", {}), fields)
    raise TrainingInputError(f"checkpoint {path} was written by another training config (hash "
                             f"{state.get('config_hash')} != {config_hash}); differing fields: " + "; ".join(diffs)
                             + ". Resume with the original settings or start a new output_dir.")


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: Any | None = None,
                    scheduler: Any | None = None) -> None:
    """Restore weights (strict), and optimizer / scheduler states when given (RNG: :func:`load_rng`)."""
    path = Path(path)
    missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=True)
    if missing or unexpected:  # load_model(strict=True) raises first; kept for clarity
        raise TrainingInputError(f"checkpoint {path} does not match the draft: {missing} {unexpected}")
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))


def load_rng(path: str | Path) -> None:
    """Restore the RNG states saved with the checkpoint (call right before training continues)."""
    set_rng_state(torch.load(Path(path) / "rng.pt", weights_only=True))
