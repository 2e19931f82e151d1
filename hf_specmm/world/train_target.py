"""Train the world target from scratch, in two stages, like LLaVA on top of a pretrained vision encoder:

0. vision pretraining: the vision tower + a throw-away linear head classify every grid cell of freshly
   sampled scenes (empty, or size × colour × shape). Without it the answer loss alone plateaus: colours and
   positions are learnt, shapes and sizes stay at chance even after 3000 steps (0.08 caption exact match),
   because the LM cannot learn to read features the tower does not produce yet, and vice versa;
1. the tower frozen (as LLaVA freezes its CLIP encoder: trained on, the pretrained features were lost
   again within the first hundreds of steps, shape read out linearly at 0.70 instead of 1.0), the projector
   and the LM trained with cross-entropy on the answer tokens (teacher forcing) of the world's training
   lines, the same batch layout as draft distillation (``hf_specmm.train.data``: left-padded prompt, right-padded answer + EOS,
   positions as ``generate`` numbers them), AdamW with warm-up and cosine decay, seeded sampling.

Example::

    >>> from hf_specmm.world.train_target import TargetTrainConfig, train_world_target
    >>> report = train_world_target(TargetTrainConfig(world_dir="world", output_dir="target"))  # doctest: +SKIP
    >>> report["heldout_accuracy"]["vqa"]  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..targets import target_family
from ..train.data import Example, Sampler, load_examples, make_batch
from ..train.responses import tokenize_given
from .evaluate import answer_accuracy, unseen
from .scenes import CELLS, COLOURS, SHAPES, SIZES, render, sample_scene
from .target import WorldTargetConfig, build_world_processor, build_world_target


@dataclass
class TargetTrainConfig:
    """One target training run on a world folder written by :func:`~hf_specmm.world.generate_world`."""

    world_dir: str
    output_dir: str
    model: WorldTargetConfig = field(default_factory=WorldTargetConfig)
    vision_steps: int = 300  # stage 0 (vision pretraining on sampled scenes)
    steps: int = 3500
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    eval_examples: int = 300  # held-out lines scored for accuracy: the first ones of evaluate.unseen(heldout, train)
    progress: bool = True

    def validate(self) -> None:
        problems = [f"{name}={getattr(self, name)} (must be >= 1)" for name in ("steps", "batch_size")
                    if getattr(self, name) < 1]
        if self.vision_steps < 0:
            problems.append(f"vision_steps={self.vision_steps} (0 skips vision pretraining)")
        if self.lr <= 0:
            problems.append(f"lr={self.lr} (must be > 0)")
        for name in ("train.jsonl", "heldout.jsonl"):
            if not (Path(self.world_dir) / name).is_file():
                problems.append(f"{Path(self.world_dir) / name} is missing (write the world with generate_world)")
        if problems:
            raise ValueError("invalid target training config: " + "; ".join(problems))


def _lr_factor(step: int, cfg: TargetTrainConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _cell_labels(scenes: list) -> torch.Tensor:
    """[N, 9]: 0 = empty cell, else 1 + index of (size, colour, shape)."""
    labels = torch.zeros(len(scenes), len(CELLS), dtype=torch.long)
    for i, scene in enumerate(scenes):
        for o in scene.objects:
            kind = (SIZES.index(o.size) * len(COLOURS) + COLOURS.index(o.colour)) * len(SHAPES) + SHAPES.index(o.shape)
            labels[i, CELLS.index((o.row, o.column))] = 1 + kind
    return labels


def pretrain_vision(model: Any, processor: Any, cfg: TargetTrainConfig) -> list[float]:
    """Stage 0: per-cell classification of sampled scenes from the vision tower's features (head discarded)."""
    if cfg.model.image_size // cfg.model.patch_size != 3:
        raise ValueError("vision pretraining labels one image token per grid cell: use image_size = 3 × patch_size")
    tower = model.model.vision_tower
    n_classes = 1 + len(SIZES) * len(COLOURS) * len(SHAPES)
    head = torch.nn.Linear(model.config.vision_config.hidden_size, n_classes)
    optimizer = torch.optim.AdamW([*tower.parameters(), *head.parameters()], lr=cfg.lr)
    rng, losses = random.Random(f"{cfg.seed}/vision"), []
    for _ in tqdm(range(cfg.vision_steps), desc="vision pretraining", unit="step", disable=not cfg.progress):
        scenes = [sample_scene(rng) for _ in range(cfg.batch_size)]
        pixels = processor.image_processor([render(s, cfg.model.image_size) for s in scenes],
                                           return_tensors="pt")["pixel_values"].to(model.device)
        features = tower(pixels, output_hidden_states=True).hidden_states[model.config.vision_feature_layer]
        loss = torch.nn.functional.cross_entropy(head(features).flatten(0, 1), _cell_labels(scenes).flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(round(loss.item(), 4))
    return losses


def answer_loss(model: Any, processor: Any, examples: list[Example], pad_id: int) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy of the answer tokens (EOS included) given image + prompt; and the token count."""
    batch = make_batch(processor, examples, "raw", pad_id, model.device)
    width = batch.response_ids.shape[1]
    positions = target_family(model).positions.prompt_positions(batch.full_mask)
    out = model(input_ids=batch.full_ids, attention_mask=batch.full_mask, position_ids=positions,
                use_cache=False, logits_to_keep=width + 1, **batch.inputs)
    logits = out.logits[:, :width]  # column P-1+r predicts answer token r
    loss = torch.nn.functional.cross_entropy(logits[batch.response_mask], batch.response_ids[batch.response_mask])
    return loss, batch.tokens


def train_world_target(cfg: TargetTrainConfig) -> dict[str, Any]:
    """Train, save (safetensors + processor) into ``cfg.output_dir`` and return the report written beside it."""
    cfg.validate()
    world = Path(cfg.world_dir)
    train = load_examples(world / "train.jsonl")
    heldout = unseen(load_examples(world / "heldout.jsonl"), train)[: cfg.eval_examples]
    torch.manual_seed(cfg.seed)
    model, processor = build_world_target(cfg.model, cfg.seed), build_world_processor(cfg.model)
    placeholders = frozenset({model.config.image_token_id})
    for e in train + heldout:
        e.response_ids = tokenize_given(processor, e, model, placeholders)
    pad_id = int(model.generation_config.pad_token_id)
    stage1 = [(n, p) for n, p in model.named_parameters() if not (cfg.vision_steps and "vision_tower" in n)]
    decay = [p for n, p in stage1 if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in stage1 if not (p.ndim >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.98))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, cfg))
    sampler = Sampler({"train": train}, cfg.seed)
    start = time.perf_counter()
    model.train()
    vision_losses = pretrain_vision(model, processor, cfg) if cfg.vision_steps else []
    if cfg.vision_steps:
        model.model.vision_tower.requires_grad_(False)
    losses, tokens = [], 0
    bar = tqdm(range(cfg.steps), desc="world target", unit="step", disable=not cfg.progress)
    for _ in bar:
        loss, n = answer_loss(model, processor, sampler.draw("train", cfg.batch_size), pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        losses.append(round(loss.item(), 4))
        tokens += n
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    train_s = time.perf_counter() - start
    model.eval()
    accuracy = answer_accuracy(model, processor, heldout)
    blind = answer_accuracy(model, processor, heldout, shuffle_images=True)
    out = Path(cfg.output_dir)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    report = {"config": {**dataclasses.asdict(cfg), "model": cfg.model.to_dict()},
              "parameters": sum(p.numel() for p in model.parameters()), "train_examples": len(train),
              "answer_tokens": tokens, "train_time_s": round(train_s, 1),
              "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
              "heldout_accuracy": accuracy, "heldout_accuracy_shuffled_images": blind,
              "heldout_examples": len(heldout), "vision_final_loss": vision_losses[-1] if vision_losses else None,
              "losses": losses}
    (out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
