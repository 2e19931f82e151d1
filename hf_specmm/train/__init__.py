"""Distil a draft for a LLaVA-family target: ``train_draft(TrainConfig(...))`` or ``hf-specmm train``.

    >>> from hf_specmm.train import TrainConfig, train_draft
    >>> result = train_draft(TrainConfig(target="path/to/llava", data="data.jsonl", output_dir="runs/d1",
    ...                                  draft_config="small", draft_kind="image_adapter"))  # doctest: +SKIP
    >>> result.tau_before["block_efficiency"], result.tau_after["block_efficiency"]  # doctest: +SKIP

Modules: ``config`` (TrainConfig, presets, config hash) · ``data`` (JSONL, prompts, batches) ·
``responses`` (the target's answers, cached) · ``models`` (target / draft loading and checks) ·
``losses`` (KL / TVD / CE on the proposable ids) · ``trainer`` (stages, steps) · ``checkpoint`` ·
``evaluate`` (held-out τ through hf_specmm's generate) · ``run`` (``train_draft``) · ``cli``.
"""

from .checkpoint import latest_checkpoint
from .config import DRAFT_PRESETS, TrainConfig, TrainingInputError
from .data import Example, load_examples
from .evaluate import measure_tau
from .run import TrainResult, train_draft

__all__ = ["DRAFT_PRESETS", "Example", "TrainConfig", "TrainResult", "TrainingInputError", "latest_checkpoint",
           "load_examples", "measure_tau", "train_draft"]
