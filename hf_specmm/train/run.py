"""``train_draft``: a whole training run, from a config to a saved (and optionally pushed) draft whose
model card carries the held-out τ measured with hf_specmm's generate path.

Order matters: every input check (config values, data lines and images, the draft against the target,
the resume checkpoint's config hash) runs before the first forward pass (the target's answers).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from transformers import PreTrainedModel

from ..devices import execution_device
from ..drafts import get_kind, kind_of
from ..hub import annotate_draft, push_draft_to_hub, save_draft
from ..targets import target_spec
from ..vocab import VocabMap, draft_vocab_size
from .checkpoint import check_compatible, latest_checkpoint, read_state
from .config import TrainConfig, TrainingInputError, config_hash, resolve_draft_config
from .data import format_prompt, load_examples, split_heldout
from .distributed import Processes
from .evaluate import card_results, measure_tau
from .models import default_target_name, file_sha256, fingerprint, load_target, make_draft
from .responses import fill_responses, read_response_cache
from .trainer import Trainer


@dataclass
class TrainResult:
    """What a run produced. ``tau_before`` / ``tau_after``: held-out measurements (see ``measure_tau``)."""

    output_dir: Path
    draft: PreTrainedModel
    draft_kind: str
    completed: bool  # False: stopped at ``stop_at_step`` (resume with ``resume="latest"``)
    global_step: int
    config_hash: str
    draft_dir: Path | None = None
    last_checkpoint: Path | None = None
    tau_before: dict[str, Any] | None = None
    tau_after: dict[str, Any] | None = None
    train_tokens: int = 0  # response tokens trained on (all stages, all micro-batches)
    train_time_s: float = 0.0  # optimizer steps only (no evaluation, no answer generation)
    target_forward_s: float = 0.0  # of which: the on-the-fly target forwards
    responses_generated: int = 0
    responses_cached: int = 0
    losses: list[float] = field(default_factory=list)  # per optimizer step of this invocation
    pushed_to: str | None = None

    @property
    def seconds_per_1k_tokens(self) -> float:
        return 1000 * self.train_time_s / self.train_tokens if self.train_tokens else 0.0

    def summary(self) -> dict[str, Any]:
        keys = ("draft_kind", "completed", "global_step", "config_hash", "tau_before", "tau_after", "train_tokens",
                "train_time_s", "target_forward_s", "responses_generated", "responses_cached", "pushed_to")
        out = {k: getattr(self, k) for k in keys}
        out.update(seconds_per_1k_tokens=round(self.seconds_per_1k_tokens, 4), output_dir=str(self.output_dir),
                   draft_dir=None if self.draft_dir is None else str(self.draft_dir),
                   last_checkpoint=None if self.last_checkpoint is None else str(self.last_checkpoint))
        return out


def answer_counts(examples: list, vocab: int) -> Any:
    """Occurrences of each target id in the examples' answers ([vocab] float tensor)."""
    import torch

    ids = torch.tensor([i for e in examples for i in (e.response_ids or ()) if 0 <= i < vocab], dtype=torch.long)
    return torch.bincount(ids, minlength=vocab).float()


def _resume_path(cfg: TrainConfig) -> Path | None:
    if cfg.resume is None:
        return None
    if cfg.resume == "latest":
        path = latest_checkpoint(cfg.output_dir)
        if path is None:
            raise TrainingInputError(f"resume='latest' but {cfg.output_dir} holds no complete checkpoint")
        return path
    return Path(cfg.resume)


def _fingerprints(cfg: TrainConfig) -> dict[str, Any]:
    fps: dict[str, Any] = {"target": fingerprint(cfg.target), "data": "sha256:" + file_sha256(cfg.data),
                           # a held-out file means no split: the training set changes with it
                           "eval_data": None if cfg.eval_data is None else "sha256:" + file_sha256(cfg.eval_data)}
    if cfg.draft is not None:
        fps["draft"] = fingerprint(cfg.draft)
    else:
        fps["draft_config"] = resolve_draft_config(cfg.draft_config)
    return fps


def _check_context(cfg: TrainConfig, processor: Any, draft: Any, examples: list) -> None:
    """The longest text prompt + answer must fit the draft's context window (positions past it are garbage)."""
    context = getattr(draft.config.get_text_config(), "max_position_embeddings", None)
    if context is None:
        return
    lengths = [len(processor.tokenizer(format_prompt(processor, e, cfg.prompt_format))["input_ids"]) for e in examples]
    longest = max(lengths) + max(cfg.max_new_tokens, cfg.eval_max_new_tokens or 0) + 1
    if longest > context:
        line = examples[lengths.index(max(lengths))]
        raise TrainingInputError(f"{line.source} line {line.line}: prompt ({max(lengths)} text tokens) + answer "
                                 f"exceeds the draft's context window ({context}); shorten it or lower max_new_tokens")


def _describe_data(cfg: TrainConfig, train: list, held: list, result: TrainResult) -> str:
    images = sum(e.image is not None for e in train)
    how = "given in the data" if all(e.response is not None for e in train) else (
        f"generated by the target ({'sampled' if cfg.do_sample else 'greedy'}, max_new_tokens={cfg.max_new_tokens})")
    text = (f"{len(train)} prompts from `{Path(cfg.data).name}` ({images} with an image); answers {how}; "
            f"{cfg.loss} distillation on the answer tokens, {result.global_step} optimizer steps, "
            f"{result.train_tokens:,} answer tokens (hf_specmm train, seed {cfg.seed}).")
    if result.tau_before and result.tau_after:
        before, after = result.tau_before["block_efficiency"], result.tau_after["block_efficiency"]
        text += (f" Held-out τ ({len(held)} prompts, γ={cfg.eval_gamma}): {before:.2f} before training, "
                 f"{after:.2f} after.")
    return text


def run_plan(cfg: TrainConfig, procs: Processes, kind: str, stages: tuple[int, ...]) -> str:
    """What a run will do, printed by ``hf-specmm train`` on the main process before any forward: the
    processes, the batch per process and per optimizer step, the device, and stages × steps.

        >>> from hf_specmm.train import TrainConfig
        >>> cfg = TrainConfig(target="t", data="d.jsonl", output_dir="o", draft_config="tiny", steps=150,
        ...                   batch_size=4, grad_accum=2)
        >>> print(run_plan(cfg, Processes("cpu"), "feature_head", (1, 2)))  # doctest: +NORMALIZE_WHITESPACE
        hf-specmm train: 1 process on cpu; batch 4 per process x 1 process x 2 accumulated = 8 examples per
        optimizer step; feature_head draft: stage 1 (language) 150 steps + stage 2 (multimodal) 150 steps =
        300 optimizer steps
    """
    names = {1: "language", 2: "multimodal"}
    steps = [cfg.stage_steps(s) for s in stages]
    plan = " + ".join(f"stage {s} ({names.get(s, s)}) {n} steps" for s, n in zip(stages, steps))
    world = f"{procs.world} process{'es' if procs.world > 1 else ''}"
    line = (f"hf-specmm train: {world} on {procs.device}; batch {cfg.batch_size} per process x {world} x "
            f"{cfg.grad_accum} accumulated = {cfg.batch_size * procs.world * cfg.grad_accum} examples per optimizer "
            f"step; {kind} draft: {plan} = {sum(steps)} optimizer steps")
    if procs.world == 1 and os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true":
        line += ("\nhf-specmm train: note: `accelerate launch --cpu` starts ONE process whatever --num_processes "
                 "says; for N CPU processes run `torchrun --nproc_per_node N -m hf_specmm.cli train ... --device cpu`")
    return line


def _make_folders(*folders: Path) -> None:
    """The run's output folder and its answer cache's, made when the run starts (checked writable while parsing by
    ``hf-specmm train``): an unwritable one is refused before any work, not after training."""
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TrainingInputError(f"cannot make the folder {folder} ({err.strerror or err})") from None


def train_draft(cfg: TrainConfig, echo: Callable[[str], Any] | None = None) -> TrainResult:
    """Distil a draft from the target and measure it on held-out prompts. ``echo`` (e.g. ``print``) gets
    :func:`run_plan`'s line on the main process, before any forward pass.

    Example::

        >>> from hf_specmm.train import TrainConfig, train_draft
        >>> result = train_draft(TrainConfig(target="llava-hf/llava-1.5-7b-hf", data="data.jsonl",
        ...                                  output_dir="runs/d1", draft_config="vicuna-68m"))  # doctest: +SKIP
        >>> result.tau_before["block_efficiency"], result.tau_after["block_efficiency"]  # doctest: +SKIP
    """
    cfg.validate()
    procs = Processes(cfg.device)  # under accelerate launch / torchrun: this process of several
    procs.check_supported()
    placement = procs.target_placement(cfg.target_device_map)  # may move this process to its GPU share
    if isinstance(placement.get("device_map"), dict) and "disk" in placement["device_map"].values():
        placement["offload_folder"] = Path(cfg.output_dir) / "target-offload" / f"process-{procs.rank}"
    cfg = dataclasses.replace(cfg, device=str(procs.device))
    out = Path(cfg.output_dir)
    # 1. data (every line and image checked), held-out split
    examples = load_examples(cfg.data, cfg.images)
    if cfg.eval_data is not None:
        train, held = examples, load_examples(cfg.eval_data, cfg.images)
    else:
        train, held = split_heldout(examples, cfg.eval_fraction, cfg.seed)
    # 2. the resume checkpoint must come from this very configuration
    fields = cfg.hashed_fields(_fingerprints(cfg), processes=procs.world)
    chash = config_hash(fields)
    resume = _resume_path(cfg)
    state = {"config_hash": chash, "config_fields": fields, "config": cfg.to_dict(), "global_step": 0, "stage": 0,
             "stage_step": 0}
    if resume is not None:
        saved = read_state(resume)
        check_compatible(saved, fields, chash, resume)
        state.update({k: v for k, v in saved.items() if k not in ("config", "config_fields")})
    cache = Path(cfg.response_cache) if cfg.response_cache else out.resolve().parent / "hf_specmm_responses.jsonl"
    read_response_cache(cache)  # a file that is not this cache is refused now, not appended to later
    _make_folders(out, cache.parent)  # before any model is loaded: nothing can fail to be written at the end
    # 3. models (no forward pass), the draft checked against the target
    target, processor = load_target(cfg.target, cfg.device, cfg.dtype, **placement,
                                    trust_remote_code=cfg.trust_remote_code)
    if cfg.prompt_format == "chat" and not getattr(processor, "chat_template", None):
        raise TrainingInputError(f"prompt_format='chat' but the processor of {cfg.target} has no chat template; "
                                 "use prompt_format='raw' (prompts as written, image token prepended)")
    target_name = cfg.target_name or default_target_name(cfg.target)
    draft, kind = make_draft(cfg, target, processor.tokenizer, target_name)
    procs.broadcast_parameters(draft)
    stages = cfg.resolved_stages(kind)
    kind_stages = get_kind(kind).stages
    if not set(stages) <= set(kind_stages):
        raise TrainingInputError(f"stages {list(stages)}: a {get_kind(kind).title} draft has stage(s) "
                                 f"{list(kind_stages)} only (stage 2 trains the image adapter)")
    if 2 in stages and not any(e.image is not None for e in train):
        raise TrainingInputError(f"stage 2 (multimodal) needs lines with an image; {cfg.data} has none")
    _check_context(cfg, processor, draft, train + held)
    if echo is not None and procs.is_main:
        echo(run_plan(cfg, procs, kind, stages))
    spec = target_spec(target)
    own_vocab = kind_of(draft).target_vocab_size  # a kind scoring with the target's LM head: the target's vocabulary
    vocab = VocabMap(spec, draft_vocab_size(draft) if own_vocab is None else own_vocab(draft, target),
                     execution_device(target))
    # 4. the target's answers (first forward passes), cached next to the output folder
    generated, cached = fill_responses(target, processor, train, cfg, cache, fields["target"], spec.placeholder_ids,
                                       procs)
    if cfg.draft is None and hasattr(draft, "select_draft_vocab"):  # a fresh EAGLE-3 head: its draft vocabulary
        draft.select_draft_vocab(answer_counts(train, draft.t2d.numel()))  # is the answers' most frequent ids
    # 5. τ of the untrained draft, training, τ after
    eval_tokens = cfg.eval_max_new_tokens or cfg.max_new_tokens
    if resume is None and held and cfg.eval_before:
        state["tau_before"] = measure_tau(target, processor, draft, held, cfg.eval_gamma, eval_tokens,
                                          cfg.eval_batch_size, cfg.prompt_format, procs)
    trainer = Trainer(cfg, target, processor, draft, vocab, train, state, procs)
    completed = trainer.run(stages, resume)
    result = TrainResult(out, draft.eval(), kind, completed, state["global_step"], chash,
                         last_checkpoint=trainer.last_checkpoint, tau_before=state.get("tau_before"),
                         train_tokens=trainer.train_tokens, train_time_s=trainer.train_time_s,
                         target_forward_s=trainer.target_forward_s, responses_generated=generated,
                         responses_cached=cached, losses=trainer.losses)
    if completed:
        if held:
            result.tau_after = measure_tau(target, processor, draft, held, cfg.eval_gamma, eval_tokens,
                                           cfg.eval_batch_size, cfg.prompt_format, procs)
        task = cfg.task_name or f"held-out {Path(cfg.eval_data or cfg.data).stem}"
        annotate_draft(draft, target=target_name, results={task: card_results(result.tau_after)} if held else None,
                       training_data=_describe_data(cfg, train, held, result))
        result.draft_dir = out / "draft"
        if procs.is_main:  # the processes hold identical drafts: saved and pushed once
            save_draft(draft, result.draft_dir, target=target_name)
            if cfg.push_to_hub:
                push_draft_to_hub(draft, cfg.push_to_hub, target=target_name, token=cfg.hub_token,
                                  private=cfg.hub_private or None)
        result.pushed_to = cfg.push_to_hub
    if procs.is_main:
        out.mkdir(parents=True, exist_ok=True)
        summary = {**result.summary(), "processes": procs.world}
        (out / "train_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    procs.barrier()  # every process returns once the draft and the summary are on disk
    return result
