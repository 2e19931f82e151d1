"""The shipped world checkpoints (target + distilled drafts, in ``hf_specmm/world/checkpoints``), the
untrained baseline draft, and the fixed held-out evaluation scenes the demo, the τ table and the tests use.

Example::

    >>> from hf_specmm.world.shipped import load_world_models, eval_examples
    >>> models = load_world_models()
    >>> sorted(models.drafts)
    ['DFlash (distilled)', 'EAGLE-3 head (distilled)', 'MTP layer (distilled)', 'feature-head (distilled)', 'image-adapter (distilled)', 'text-only (distilled)', 'text-only (untrained)']
"""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration, PreTrainedModel

from ..errors import SpecMMError, check_strict_load
from ..hub import load_draft
from ..train.data import Example, load_examples
from ..train.models import fresh_language_model
from .dataset import generate_world, world_records
from .recipe import DRAFT_CONFIG, DRAFT_DIRS, DRAFT_TRAINING, TARGET_NAME, WORLD
from .tasks import TASKS

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
EVAL_SEED = 1  # the evaluation scenes: another seed than the training world's (WORLD["seed"])
DRAFT_NAMES = {"text-only (untrained)": None, "text-only (distilled)": DRAFT_DIRS["text_only"],
               "image-adapter (distilled)": DRAFT_DIRS["image_adapter"],
               "feature-head (distilled)": DRAFT_DIRS["feature_head"],  # EAGLE-1
               "EAGLE-3 head (distilled)": DRAFT_DIRS["eagle3"],
               "DFlash (distilled)": DRAFT_DIRS["dflash"],
               "MTP layer (distilled)": DRAFT_DIRS["mtp"]}


@dataclass
class WorldModels:
    target: PreTrainedModel
    processor: Any
    drafts: dict[str, PreTrainedModel]  # DRAFT_NAMES order
    recipe: dict[str, Any]  # recipe.json: settings and the numbers measured when the checkpoints were made


def check_world_checkpoints(ship: Path) -> None:
    """Raise :class:`SpecMMError` unless ``ship`` holds every world checkpoint and the recipe (before any load)."""
    missing = [name for name in (TARGET_NAME, *DRAFT_DIRS.values(), "recipe.json") if not (ship / name).exists()]
    if missing:
        raise SpecMMError(f"{ship} lacks {missing}: reinstall hf_specmm, or rebuild them with "
                          "`python examples/train_world.py --overwrite-shipped`")


def world_checkpoints(text: str) -> str:
    """An argparse ``type=`` (``--checkpoints``): a folder holding the world checkpoints (checked now)."""
    import argparse

    try:
        check_world_checkpoints(Path(text).expanduser())
    except SpecMMError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def load_world_models(ship_dir: str | Path = CHECKPOINTS) -> WorldModels:
    """Target, processor and the drafts of ``DRAFT_NAMES`` (the untrained one rebuilt from the recipe's seed),
    float32, eval."""
    ship = Path(ship_dir)
    check_world_checkpoints(ship)
    target, info = LlavaForConditionalGeneration.from_pretrained(ship / TARGET_NAME, dtype=torch.float32,
                                                                 output_loading_info=True, trust_remote_code=False)
    check_strict_load(info, str(ship / TARGET_NAME))
    target.eval()
    processor = AutoProcessor.from_pretrained(ship / TARGET_NAME, trust_remote_code=False)
    drafts = {}
    for name, folder in DRAFT_NAMES.items():
        if folder is None:  # the very initialisation the distilled text-only draft started from
            draft = fresh_language_model(target, dict(DRAFT_CONFIG), DRAFT_TRAINING["seed"])
        else:
            draft = load_draft(ship / folder)
        drafts[name] = draft.to(torch.float32).eval()
    return WorldModels(target, processor, drafts, json.loads((ship / "recipe.json").read_text()))


@functools.lru_cache(maxsize=1)
def training_scenes() -> frozenset[tuple]:
    """Every scene of the recipe's training split (``tuple(scene.objects)``), listed without rendering."""
    return frozenset(tuple(scene.objects) for _, split, scene, *_ in
                     world_records(WORLD["n"], WORLD["seed"]) if split == "train")


def eval_examples(per_task: int, work_dir: str | Path | None = None) -> dict[str, list[Example]]:
    """``per_task`` held-out scenes of each task: the evaluation world (seed ``EVAL_SEED``) with every scene of
    the recipe's training split drawn again, so no evaluation image was trained on.

    Written to ``work_dir`` (a temporary folder by default); the same ``per_task`` always gives the same lines.
    """
    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    root = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="hf_specmm_world_"))
    world = generate_world(root / f"eval-world-seed{EVAL_SEED}", n=3 * per_task, seed=EVAL_SEED,
                           splits={"heldout": 1.0}, image_size=WORLD["image_size"],
                           exclude_scenes=training_scenes())
    by_task: dict[str, list[Example]] = {task: [] for task in TASKS}
    for example in load_examples(world / "heldout.jsonl"):
        by_task[example.task].append(example)
    return by_task
