"""The optimisation loop: teacher-forced distillation of the draft on the target's answers.

Each micro-batch runs the frozen target once (no grad) over ``[prompt | response]`` with the images and
keeps only the response positions' logits (``logits_to_keep``); the draft reads its own view of the same
prompt followed by the response. The view is the draft kind's ``training_view`` for the stage: the very
``Drafter`` that runs at inference, so ``draft_inputs`` is shared (text view: placeholders removed;
adapter view: pooled placeholders filled with the target's own image embeddings, captured by the
drafter's ``watch`` around the target's forward; VLM view: the prompt and images as the target reads
them). Positions come from the target family's rule, the same one the inference caches use.

Target logits are computed **on the fly**, not cached: one extra no-grad target forward per micro-batch,
no disk, exact full distributions (KL / TVD need no top-k truncation). A top-k cache would cost
N_tokens × k × (4 + 4) bytes (fp32 value + int32 id), e.g. 10 M tokens × k = 64 → 5.1 GB, and would
bias both losses by the dropped tail; it would only pay off when training many epochs on the same
answers with a target much slower than the draft's own step.

Stages (which ones a kind has, and what each trains, come from its registration): 1 = language (every
line), 2 = multimodal (the share of image lines per step ramps linearly from ``mm_share_start`` to 1.0,
the rest are text-only lines; adapter drafts: the adapter at ``stage2_lr``, the LM at ``stage2_lm_lr``).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..drafter import Drafter, Prompt
from ..drafts import kind_of
from ..targets import target_family
from ..vocab import VocabMap
from .checkpoint import checkpoint_path, load_checkpoint, load_rng, save_checkpoint
from .config import TrainConfig
from .data import Batch, Example, Sampler, make_batch
from .distributed import Processes
from ..drafts.distill import distill_loss, proposable_columns


class Trainer:
    """Runs the stages of one training run on an already checked draft (see :func:`train_draft`)."""

    def __init__(self, cfg: TrainConfig, target: Any, processor: Any, draft: Any, vocab: VocabMap,
                 examples: list[Example], state: dict[str, Any], procs: Processes | None = None):
        self.procs = procs if procs is not None else Processes(cfg.device)  # one process unless launched
        self.cfg, self.target, self.processor, self.draft, self.vocab = cfg, target, processor, draft, vocab
        self.state = state  # written into every checkpoint (config hash, counters, τ before, ...)
        self.kind = kind_of(draft)
        self.positions = target_family(target).positions  # the rule inference uses for the target too
        self.columns = proposable_columns(vocab)
        self.pad_id = int(target.generation_config.pad_token_id or 0)
        self.sampler = Sampler({"all": examples, "image": [e for e in examples if e.image is not None],
                                "text": [e for e in examples if e.image is None]}, cfg.seed)
        self.device = torch.device(cfg.device)
        # totals over the whole run, a resumed run continuing the interrupted one's counts
        self.train_tokens = int(state.get("train_tokens", 0))
        self.train_time_s = float(state.get("train_time_s", 0.0))
        self.target_forward_s = float(state.get("target_forward_s", 0.0))
        self.losses: list[float] = []
        self.last_checkpoint: Path | None = None

    # ---- one step ----------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.cfg.dtype == "bf16")

    def view(self, stage: int) -> Drafter:
        """The drafter whose ``draft_inputs`` and ``model`` this stage trains (the kind's training view)."""
        return self.kind.training_view(self.draft, self.vocab, stage)

    def _target_logits(self, batch: Batch, view: Drafter) -> torch.Tensor:
        """The target's answer logits; the view watches the forward (an adapter view captures the image embeddings)."""
        width = batch.response_ids.shape[1]
        start = time.perf_counter()
        positions = self.positions.bind(self.target, batch.prompt_ids, batch.prompt_mask, batch.inputs)
        with torch.no_grad(), self._autocast(), view.watch(self.target):
            out = self.target(input_ids=batch.full_ids, attention_mask=batch.full_mask,
                              position_ids=positions.prompt_positions(batch.full_mask), use_cache=False,
                              logits_to_keep=width + 1, **batch.inputs)
        self.target_forward_s += time.perf_counter() - start
        # column P-1+r predicts response token r; a dispatched target's last layer may be on another device
        return out.logits[:, :width].to(self.device)

    def _draft_logits(self, batch: Batch, view: Drafter) -> torch.Tensor:
        prompt = view.draft_inputs(Prompt(batch.prompt_ids, batch.prompt_mask, batch.inputs))
        # response ids the draft cannot read (outside its vocabulary) are read as a stand-in, as the drafters' _queue does
        draft_ids = torch.cat([prompt.ids, self.vocab.readable(batch.response_ids)], 1)
        mask = torch.cat([prompt.valid, batch.response_mask], 1).long()
        width = batch.response_ids.shape[1]
        with self._autocast():
            out = view.model(input_ids=draft_ids, attention_mask=mask, position_ids=prompt.positions.prompt_positions(mask),
                             use_cache=False, logits_to_keep=width + 1, **prompt.extra)
        return out.logits[:, :width]

    def _micro_step(self, examples: list[Example], view: Drafter, total_tokens: int) -> dict[str, float]:
        batch = make_batch(self.processor, examples, self.cfg.prompt_format, self.pad_id, self.device)
        t_logits = None
        if self.cfg.loss != "ce" or view.observes_prefill:  # CE needs no target logits, a watching view its forward
            t_logits = self._target_logits(batch, view)
        if self.kind.loss is not None:  # the kind's own loss (e.g. a feature head's regression on hidden states)
            with self._autocast():
                loss, metrics = self.kind.loss(view, batch, t_logits, self.cfg, self.columns)
        else:
            d_logits = self._draft_logits(batch, view)
            sel = batch.response_mask
            loss, metrics = distill_loss(d_logits[sel], None if t_logits is None or self.cfg.loss == "ce"
                                         else t_logits[sel], batch.response_ids[sel], self.columns, self.cfg.loss)
        (loss / total_tokens).backward()
        metrics["loss"] = float(loss.detach())
        return metrics

    def _step(self, stage: int, stage_step: int, n_steps: int, params: list) -> tuple[dict[str, float], int]:
        cfg, procs = self.cfg, self.procs
        # every process draws the whole global batch (same sampler) and trains its slice of each micro-batch
        micro = cfg.batch_size * procs.world
        n = micro * cfg.grad_accum
        if stage == 1:
            examples = self.sampler.draw("all", n)
        else:
            share = 1.0 if n_steps == 1 else cfg.mm_share_start + (1 - cfg.mm_share_start) * stage_step / (n_steps - 1)
            m = n if not self.sampler.pools["text"] else round(share * n)
            examples = self.sampler.draw("image", m) + self.sampler.draw("text", n - m)
        total = sum(len(e.response_ids or ()) for e in examples)  # the whole step's answer tokens, all processes
        sums: dict[str, float] = {}
        view = self.view(stage)
        for i in range(0, n, micro):
            for key, value in self._micro_step(procs.local_slice(examples, i, micro), view, total).items():
                sums[key] = sums.get(key, 0.0) + value
        procs.sum_gradients(params)  # = the gradient of one process training the whole global batch
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        return {k: v / total for k, v in procs.sum(sums).items()}, total

    # ---- stages ------------------------------------------------------------------------------------
    def _optimizer(self, stage: int, n_steps: int) -> tuple[torch.optim.Optimizer, Any, list]:
        cfg = self.cfg
        groups = self.kind.param_groups(self.draft, stage, cfg)  # what the draft kind trains in this stage
        optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)

        def factor(step: int) -> float:  # linear warm-up, then cosine down to min_lr_ratio
            if step < cfg.warmup_steps:
                return (step + 1) / (cfg.warmup_steps + 1)
            progress = (step - cfg.warmup_steps) / max(1, n_steps - cfg.warmup_steps)
            return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return optimizer, scheduler, [p for g in groups for p in g["params"]]

    def run(self, stages: tuple[int, ...], resume_from: Path | None) -> bool:
        """Train every stage; returns False when stopped early at ``cfg.stop_at_step`` (checkpoint written)."""
        cfg, state = self.cfg, self.state
        if resume_from is not None:
            load_checkpoint(resume_from, self.draft)
            self.sampler.load_state_dict(state["sampler"])
        else:  # dropout & co. draw from the global RNGs: start them from the seed, whatever ran before
            torch.manual_seed(cfg.seed)
            random.seed(cfg.seed)
        self.draft.train()
        total_steps = sum(cfg.stage_steps(stage) for stage in stages)
        for stage in stages:
            n_steps = cfg.stage_steps(stage)
            if stage < state["stage"] or (stage == state["stage"] and state["stage_step"] >= n_steps):
                continue  # finished before the checkpoint we resumed from
            start = state["stage_step"] if stage == state["stage"] else 0
            state["stage"], state["stage_step"] = stage, start
            optimizer, scheduler, params = self._optimizer(stage, n_steps)
            if resume_from is not None:
                if start > 0:
                    load_checkpoint(resume_from, self.draft, optimizer, scheduler)
                load_rng(resume_from)  # the RNG exactly as the uninterrupted run had it here
                resume_from = None
            bar = tqdm(total=n_steps, initial=start, desc=f"stage {stage}", unit="step",
                       disable=not (cfg.progress and self.procs.is_main))  # one bar: the main process's
            for stage_step in range(start, n_steps):
                began = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                metrics, tokens = self._step(stage, stage_step, n_steps, params)
                optimizer.step()
                scheduler.step()
                elapsed = time.perf_counter() - began
                self.train_tokens += tokens
                self.train_time_s += elapsed
                self.losses.append(round(metrics["loss"], 6))
                state["global_step"] += 1
                state["stage_step"] = stage_step + 1
                bar.set_postfix(loss=f"{metrics['loss']:.3f}", top1=f"{metrics['draft_top1']:.2f}",
                                tok_s=f"{tokens / elapsed:.0f}")
                bar.update(1)
                stop = (cfg.stop_at_step is not None and cfg.stop_at_step <= state["global_step"] < total_steps)
                every = cfg.checkpoint_every and state["global_step"] % cfg.checkpoint_every == 0
                if every or stop or stage_step + 1 == n_steps:
                    self.checkpoint(optimizer, scheduler)
                if stop:
                    bar.close()
                    return False
            bar.close()
        return True

    def checkpoint(self, optimizer: Any, scheduler: Any) -> Path:
        self.state.update(sampler=self.sampler.state_dict(), train_tokens=self.train_tokens,
                          train_time_s=round(self.train_time_s, 3), target_forward_s=round(self.target_forward_s, 3))
        if self.procs.is_main:  # the processes hold identical drafts: written once
            save_checkpoint(self.cfg.output_dir, self.draft, optimizer, scheduler, self.state,
                            self.cfg.keep_checkpoints)
        self.procs.barrier()  # no process runs ahead of a checkpoint that is still being written
        self.last_checkpoint = checkpoint_path(self.cfg.output_dir, self.state["global_step"])
        return self.last_checkpoint
