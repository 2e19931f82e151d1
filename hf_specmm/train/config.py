"""What a training run is: :class:`TrainConfig` (one dataclass, mirrored 1:1 by the CLI flags), the draft
presets, and the config hash that ties checkpoints to the run that wrote them.

    >>> from hf_specmm.train import TrainConfig
    >>> cfg = TrainConfig(target="llava-hf/llava-1.5-7b-hf", data="data.jsonl", output_dir="runs/d1",
    ...                   draft_config="small", steps=2000)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..drafts.registry import draft_kinds, get_kind, trainable_kinds
from ..errors import SpecMMError


class TrainingInputError(SpecMMError):
    """Bad training input (data, draft choice, resume checkpoint), raised before any forward pass."""


# Fresh drafts: a small causal LM of the target's text family (Llama or Qwen2) with the target's text vocab.
DRAFT_PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128},
    "small": {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 704},
    # the shape of double7/vicuna-68m, the 2404.08856 text-only draft for LLaVA-1.5
    "vicuna-68m": {"num_hidden_layers": 2, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
}

LOSSES = ("kl", "tvd", "ce")
PROMPT_FORMATS = ("auto", "chat", "raw")

# Fields that do not change the training trajectory: a checkpoint may be resumed with other values.
_NOT_HASHED = frozenset({
    "output_dir", "resume", "stop_at_step", "checkpoint_every", "keep_checkpoints", "progress", "device",
    "response_cache", "gen_batch_size", "eval_gamma", "eval_max_new_tokens", "eval_batch_size",
    "eval_before", "task_name", "target_name", "push_to_hub", "hub_private", "hub_token", "images",
    "target_device_map",  # where the target's layers run: the same logits
    "trust_remote_code",  # whether the checkpoints' own code may run: the same models either way
})


# Fields only a kind's own loss reads: left out of the config hash at their defaults, so that adding them
# did not change the hash (and resumability) of runs of the other kinds.
_KIND_LOSS_DEFAULTS = {"feature_loss_weight": 1.0, "token_loss_weight": 0.1, "variant": None, "ttt_steps": 3,
                       "ttt_decay": 1.0, "draft_vocab_size": None, "block_size": 8, "target_layers": None,
                       "anchors": 8}
# settings of one kind only: None means "not set" (so a value given for another kind is refused, not ignored), read
# as the default (EAGLE-3's training-time test; DFlash's block)
KIND_DEFAULTS = {"ttt_steps": 3, "ttt_decay": 1.0, "block_size": 8, "anchors": 8}


@dataclass
class TrainConfig:
    """One training run. Paths may be ``str`` or ``Path``; ``target`` and ``draft`` may also be Hub ids."""

    target: str  # Hub id or local folder (model + processor), a LLaVA-family checkpoint
    data: str  # JSONL: {"image": path|null, "prompt": str, "response": str (optional)}
    output_dir: str
    images: str | None = None  # folder relative image paths are resolved against (default: the JSONL's folder)
    # -- the draft: start from `draft` (Hub id / path) or build `draft_config` (preset name, JSON path, JSON text)
    draft: str | None = None
    draft_config: str | dict | None = None
    draft_kind: str | None = None  # a registered kind (text_only, image_adapter, vlm); default: the loaded draft's, else text_only
    image_pool: int = 1  # adapter drafts built here: visual tokens pooled ×k (see ImageAdapterDraft)
    # -- the target's responses (generated when a line has no "response"; cached on disk)
    max_new_tokens: int = 32
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    gen_batch_size: int = 8
    response_cache: str | None = None  # default: <output_dir's parent>/hf_specmm_responses.jsonl
    prompt_format: str = "auto"  # chat: the processor's chat template; raw: the prompt as given; auto: chat if any
    # -- optimisation
    loss: str = "kl"  # kl (forward KL(p_target || q_draft)) | tvd | ce (cross-entropy on the response tokens)
    stages: tuple[int, ...] | None = None  # (1,) text-only drafts; (1, 2) adapter drafts by default
    steps: int = 1000  # optimizer steps of stage 1
    stage2_steps: int | None = None  # optimizer steps of stage 2 (default: `steps`)
    batch_size: int = 8  # examples per micro-batch and process (the global batch is this × processes)
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3
    stage2_lr: float | None = None  # adapter learning rate in stage 2 (default: lr)
    # the draft LM's learning rate in stage 2 (0 = frozen). Default lr / 3: on the tiny fixture a frozen LM
    # (or lr / 10) leaves acceptance at 0.59, lr / 3 and lr reach 0.88 (the LM must learn to read image slots)
    stage2_lm_lr: float | None = None
    # losses of kinds with their own (``DraftKind.loss``; feature heads: EAGLE's 1.0 and 0.1)
    feature_loss_weight: float = 1.0  # smooth-L1 regression of the target's next hidden state
    token_loss_weight: float = 0.1  # the token loss (`loss`) through the target's frozen LM head
    # EAGLE-3 heads (``draft_kind="eagle3"``, or ``feature_head`` with ``variant="eagle3"``)
    variant: str | None = None  # "eagle1" | "eagle3" for feature_head drafts
    ttt_steps: int | None = None  # training-time-test steps unrolled on the head's own outputs (None: 3)
    ttt_decay: float | None = None  # weight of step k: ttt_decay ** k (None: 1.0)
    draft_vocab_size: int | None = None  # LM-head rows: the most frequent answer ids (None: the whole vocabulary)
    # DFlash drafters (``draft_kind="dflash"``, built fresh)
    block_size: int | None = None  # the block one drafter forward denoises (γ up to block_size - 1; None: 8)
    target_layers: list[int] | None = None  # target layers whose outputs it reads (None: second, middle, second to last)
    anchors: int | None = None  # answer tokens drawn per line and step as block anchors (None: 8)
    mm_share_start: float = 0.5  # stage 2: share of image examples per step, ramped linearly to 1.0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1  # cosine decay to lr × this at the end of each stage
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    dtype: str = "fp32"  # fp32 | bf16 (autocast; draft weights stay fp32, the frozen target is loaded in bf16)
    device: str = "cpu"
    # the target dispatched by accelerate instead of whole on `device`: "auto" (over this process's share of the
    # GPUs, then CPU RAM) or a {module: device | "cpu" | "disk"} map (disk: offloaded under output_dir)
    target_device_map: str | dict | None = None
    # -- checkpoints
    checkpoint_every: int = 0  # optimizer steps; 0: only at the end of each stage
    keep_checkpoints: int = 2
    resume: str | None = None  # "latest" (in output_dir) or a checkpoint folder
    stop_at_step: int | None = None  # stop (with a checkpoint) once this global step is reached
    # -- held-out evaluation (τ measured with hf_specmm's own generate path) and publishing
    eval_data: str | None = None  # a held-out JSONL; default: `eval_fraction` of `data`
    eval_fraction: float = 0.1
    eval_gamma: int = 5
    eval_max_new_tokens: int | None = None  # default: max_new_tokens
    eval_batch_size: int = 8
    eval_before: bool = True  # also measure the untrained draft
    task_name: str | None = None  # the results key in the model card (default: "held-out <data file stem>")
    target_name: str | None = None  # what the card names as the target (default: the Hub id, or the folder name)
    push_to_hub: str | None = None
    hub_private: bool = False
    hub_token: str | None = None
    progress: bool = True
    trust_remote_code: bool = False  # let the target / draft checkpoints run their own code (their auto_map)

    def __post_init__(self) -> None:
        if self.stages is not None:
            self.stages = tuple(int(s) for s in self.stages)
        if self.variant == "eagle3" and self.draft_kind in (None, "feature_head"):
            self.draft_kind = "eagle3"  # the registered kind of EAGLE-3 heads

    # ---- derived values ----------------------------------------------------------------------------
    def resolved_stages(self, kind: str) -> tuple[int, ...]:
        return self.stages if self.stages is not None else get_kind(kind).stages

    def stage_steps(self, stage: int) -> int:
        return self.steps if stage == 1 else (self.stage2_steps if self.stage2_steps is not None else self.steps)

    def validate(self) -> None:
        """Value checks that need no file: raise :class:`TrainingInputError` naming the field."""
        problems = []
        if self.loss not in LOSSES:
            problems.append(f"loss={self.loss!r} (choose from {LOSSES})")
        if self.draft_kind is not None and self.draft_kind not in draft_kinds():
            problems.append(f"draft_kind={self.draft_kind!r} (choose from {draft_kinds()})")
        elif self.draft_kind is not None and get_kind(self.draft_kind).training_view is None:
            problems.append(f"draft_kind={self.draft_kind!r}: hf_specmm runs {get_kind(self.draft_kind).title} drafts "
                            f"but does not train them (trainable kinds: {', '.join(trainable_kinds())})")
        if self.prompt_format not in PROMPT_FORMATS:
            problems.append(f"prompt_format={self.prompt_format!r} (choose from {PROMPT_FORMATS})")
        if self.dtype not in ("fp32", "bf16"):
            problems.append(f"dtype={self.dtype!r} (fp32 or bf16)")
        if (self.draft is None) == (self.draft_config is None):
            problems.append("give exactly one of draft (a draft to start from) and draft_config (build a fresh one)")
        stages = list(self.stages or ())
        if self.stages is not None and (not stages or set(stages) - {1, 2} or stages != sorted(set(stages))):
            problems.append(f"stages={self.stages} (a sorted subset of 1, 2)")
        for name in ("steps", "batch_size", "grad_accum", "max_new_tokens", "gen_batch_size", "eval_gamma",
                     "eval_batch_size", "image_pool", "keep_checkpoints"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name}={getattr(self, name)} (must be >= 1)")
        if self.stage2_steps is not None and self.stage2_steps < 1:
            problems.append(f"stage2_steps={self.stage2_steps} (must be >= 1)")
        if not 0.0 <= self.mm_share_start <= 1.0:
            problems.append(f"mm_share_start={self.mm_share_start} (a share in [0, 1])")
        if not 0.0 <= self.eval_fraction < 1.0:
            problems.append(f"eval_fraction={self.eval_fraction} (in [0, 1))")
        if self.lr <= 0 or (self.stage2_lm_lr or 0) < 0 or (self.stage2_lr is not None and self.stage2_lr <= 0):
            problems.append("learning rates must be positive (stage2_lm_lr may be 0: frozen)")
        if isinstance(self.target_device_map, str) and self.target_device_map != "auto":
            problems.append(f"target_device_map={self.target_device_map!r} (\"auto\" or a {{module: device}} map)")
        if self.feature_loss_weight < 0 or self.token_loss_weight < 0:
            problems.append("feature_loss_weight and token_loss_weight must be >= 0")
        if self.variant not in (None, "eagle1", "eagle3"):
            problems.append(f"variant={self.variant!r} (eagle1 or eagle3)")
        elif self.variant == "eagle1" and self.draft_kind not in (None, "feature_head"):
            problems.append(f"variant='eagle1' is a feature_head variant, not of draft_kind={self.draft_kind!r}")
        elif self.variant == "eagle3" and self.draft_kind != "eagle3":
            problems.append(f"variant='eagle3' builds an EAGLE-3 head, not a draft_kind={self.draft_kind!r} draft")
        eagle3 = self.draft_kind == "eagle3"
        given = [n for n in ("ttt_steps", "ttt_decay", "draft_vocab_size") if getattr(self, n) is not None]
        if given and not eagle3:
            problems.append(f"{' / '.join(given)}: for EAGLE-3 heads only (draft_kind='eagle3' or variant='eagle3'), "
                            f"not draft_kind={self.draft_kind!r}")
        for name in ("ttt_steps", "draft_vocab_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                problems.append(f"{name}={value!r} (an integer >= 1)")
        if self.ttt_decay is not None and not self.ttt_decay > 0:
            problems.append(f"ttt_decay={self.ttt_decay!r} (> 0)")
        given = [n for n in ("block_size", "target_layers", "anchors") if getattr(self, n) is not None]
        if given and self.draft_kind != "dflash":
            problems.append(f"{' / '.join(given)}: for DFlash drafters only (draft_kind='dflash'), "
                            f"not draft_kind={self.draft_kind!r}")
        for name, low in (("block_size", 2), ("anchors", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                problems.append(f"{name}={value!r} (an integer >= {low})")
        if self.target_layers is not None and (not self.target_layers or min(self.target_layers) < 0):
            problems.append(f"target_layers={self.target_layers!r} (non-empty layer indices >= 0)")
        if self.checkpoint_every < 0:
            problems.append(f"checkpoint_every={self.checkpoint_every} (0 = end of each stage only)")
        if problems:
            raise TrainingInputError("invalid training config: " + "; ".join(problems))

    def hashed_fields(self, fingerprints: dict[str, str], processes: int = 1) -> dict[str, Any]:
        """The fields that define the training trajectory; paths replaced by content ``fingerprints``.
        ``batch_size`` is per process: what defines the trajectory is the global batch, batch_size × processes
        (a run may resume on another number of processes with the same global batch)."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name in _NOT_HASHED:
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        out["global_batch_size"] = out.pop("batch_size") * processes
        # defaults spelled out, so that leaving a flag out and passing its default hash the same
        out["stage2_steps"] = self.stage_steps(2)
        out["stage2_lr"] = self.stage2_lr if self.stage2_lr is not None else self.lr
        out["stage2_lm_lr"] = self.stage2_lm_lr if self.stage2_lm_lr is not None else self.lr / 3
        if self.draft is None:  # a fresh draft: its kind (and so its stages) is known without loading anything
            out["draft_kind"] = self.draft_kind or "text_only"
            out["stages"] = list(self.resolved_stages(out["draft_kind"]))
            if 2 not in out["stages"]:  # stage-2 settings cannot change this run
                for name in ("stage2_steps", "stage2_lr", "stage2_lm_lr", "mm_share_start", "image_pool"):
                    out.pop(name)
        for name, default in KIND_DEFAULTS.items():  # unset reads as the default: hashed the same
            if out.get(name) is None:
                out[name] = default
        for name, default in _KIND_LOSS_DEFAULTS.items():  # read by kind-specific losses only: hashed when set
            if out.get(name) == default:
                out.pop(name)
        out.update(fingerprints)  # e.g. target -> "local:<sha>", data -> "sha256:<...>"
        return out

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["hub_token"] = None if self.hub_token is None else "***"  # never written to disk
        return out


def config_hash(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def diff_fields(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``name: saved -> current`` for every field that differs (values shortened)."""

    def short(v: Any) -> str:
        text = json.dumps(v, sort_keys=True, default=str)
        return text if len(text) <= 60 else text[:57] + "..."

    names = sorted(set(saved) | set(current))
    return [f"{n}: {short(saved.get(n))} -> {short(current.get(n))}" for n in names if saved.get(n) != current.get(n)]


def resolve_draft_config(spec: str | dict) -> dict[str, Any]:
    """A preset name, a JSON file or a JSON object text -> the LM config fields of a fresh draft."""
    if isinstance(spec, dict):
        fields = dict(spec)
    elif spec in DRAFT_PRESETS:
        fields = dict(DRAFT_PRESETS[spec])
    elif spec.lstrip().startswith("{") or Path(spec).is_file():
        text = spec if spec.lstrip().startswith("{") else Path(spec).read_text()
        try:
            fields = json.loads(text)
        except ValueError as err:
            raise TrainingInputError(f"draft_config {spec!r} is not valid JSON ({err})") from None
        if not isinstance(fields, dict):
            raise TrainingInputError(f"draft_config {spec!r} is a JSON {type(fields).__name__}, not an object")
    else:
        raise TrainingInputError(f"draft_config {spec!r} is neither a preset ({', '.join(DRAFT_PRESETS)}), "
                                 "a JSON file nor a JSON object")
    missing = {"num_hidden_layers", "hidden_size", "num_attention_heads"} - set(fields)
    if missing:
        raise TrainingInputError(f"draft_config lacks {sorted(missing)} (layers, hidden size, heads)")
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"):
        value = fields.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TrainingInputError(f"draft_config {name}={value!r}: an integer >= 1")
    if fields["hidden_size"] % fields["num_attention_heads"]:
        raise TrainingInputError(f"draft_config hidden_size={fields['hidden_size']} is not a multiple of "
                                 f"num_attention_heads={fields['num_attention_heads']}")
    return fields
