"""``hf-specmm train``: the command line over :func:`hf_specmm.train.train_draft` (one flag per TrainConfig field).

    hf-specmm train --target llava-hf/llava-1.5-7b-hf --draft-config vicuna-68m --data data.jsonl --images imgs/ \\
        --output-dir runs/d1 --steps 2000 --batch-size 16 --dtype bf16 --device cuda --checkpoint-every 200
    hf-specmm train ... --resume                    # continue from the latest checkpoint in --output-dir
    hf-specmm train ... --draft-kind image_adapter --stages 1,2 --stage2-lm-lr 1e-5 --push-to-hub me/llava-draft
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # argparse is used only when the dispatcher builds the parser
    import argparse


def _stages(text: str) -> tuple[int, ...]:
    """``--stages``: a sorted subset of 1, 2 written ``1``, ``2`` or ``1,2`` (what TrainConfig.validate accepts)."""
    import argparse

    try:
        stages = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes 1, 2 or 1,2 (got {text!r})") from None
    if not stages or set(stages) - {1, 2} or list(stages) != sorted(set(stages)):
        raise argparse.ArgumentTypeError(f"takes 1, 2 or 1,2 (got {text!r})")
    return stages


def _device_map(text: str) -> str | dict:
    """``--target-device-map``: ``auto``, a JSON object ``{"module": device}`` or a JSON file holding one."""
    import argparse
    from pathlib import Path

    if text == "auto":
        return text
    try:
        value = json.loads(Path(text).read_text() if Path(text).is_file() else text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or not value:
        raise argparse.ArgumentTypeError(f"takes auto, a JSON object {{module: device}} or a JSON file (got {text!r})")
    return value


def _draft_config(text: str) -> str:
    """``--draft-config``: a preset, a JSON file or JSON text with the fields a fresh draft needs (checked now)."""
    import argparse

    from .config import TrainingInputError, resolve_draft_config

    try:
        resolve_draft_config(text)
    except TrainingInputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _response_cache(text: str) -> str:
    """``--response-cache``: a JSONL file of this cache's lines, or a new file in a writable folder (checked now)."""
    import argparse
    from pathlib import Path

    from ..cli import output_file
    from .config import TrainingInputError
    from .responses import read_response_cache

    output_file(text)
    try:
        read_response_cache(Path(text).expanduser())
    except TrainingInputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _hub_repo(text: str) -> str:
    """``--push-to-hub``: a Hub repo id (``org/name``), checked now rather than after training."""
    import argparse

    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Hub repo id (org/name): {err}") from None
    if text.count("/") != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Hub repo id of the form org/name")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the train flags on ``parser`` (called by ``hf_specmm.cli``). Numbers are range-checked by their
    ``type=`` with the bounds of :meth:`TrainConfig.validate`, so a bad value is a one-line usage error before
    the target is loaded."""
    from ..cli import device_name, int_at_least, model_source, number_in, output_folder

    positive, at_least_0 = int_at_least(1), int_at_least(0)
    g = parser.add_argument_group("inputs")
    g.add_argument("--target", required=True, type=model_source, help="target Hub id or local folder (model + processor); required")
    g.add_argument("--data", required=True,
                   help='JSONL lines {"image": path|null, "prompt": ..., "response": ...}; required')
    g.add_argument("--images", help="folder relative image paths are resolved against (default: the JSONL's folder)")
    g.add_argument("--output-dir", required=True, type=output_folder,
                   help="checkpoints, the final draft (draft/) and train_summary.json; required")
    g.add_argument("--draft", type=model_source, help="draft to start from (Hub id or path, loaded with hf_specmm.load_draft); "
                   "give this or --draft-config (default: none)")
    g.add_argument("--draft-config", type=_draft_config, help="build a fresh draft: preset (tiny, small, vicuna-68m), JSON file or JSON "
                   "text with num_hidden_layers, hidden_size, num_attention_heads [, intermediate_size, model_type]; "
                   "give this or --draft (default: none)")
    from ..drafts import draft_kinds

    g.add_argument("--draft-kind", choices=draft_kinds(),
                   help="kind of draft to train (default: the --draft's own kind, else text_only)")
    g.add_argument("--image-pool", type=positive, default=1,
                   help="adapter drafts built here: pool every k visual tokens into one (k >= 1)")
    g.add_argument("--prompt-format", choices=("auto", "chat", "raw"), default="auto",
                   help="chat: the processor's chat template; raw: the prompt as given; auto: chat if it has one")
    g = parser.add_argument_group("target answers")
    g.add_argument("--max-new-tokens", type=positive, default=32, help="longest target answer generated per prompt")
    g.add_argument("--sample", dest="do_sample", action="store_true", help="sample the answers (default: greedy)")
    g.add_argument("--temperature", type=number_in(0.0, low_open=True), default=1.0,
                   help="sampling temperature (> 0; with --sample)")
    g.add_argument("--top-p", type=number_in(0.0, 1.0, low_open=True), default=1.0,
                   help="nucleus sampling mass in (0, 1] (with --sample)")
    g.add_argument("--gen-batch-size", type=positive, default=8, help="prompts per batch when generating answers")
    g.add_argument("--response-cache", type=_response_cache,
                   help="JSONL cache of answers (default: hf_specmm_responses.jsonl next to --output-dir)")
    g = parser.add_argument_group("optimisation")
    g.add_argument("--loss", choices=("kl", "tvd", "ce"), default="kl",
                   help="kl: forward KL(target || draft); tvd: total variation; ce: cross-entropy on the answers")
    g.add_argument("--stages", type=_stages, help="1 (language), 2 (multimodal: adapter drafts) or 1,2 "
                   "(default: the draft kind's own, e.g. 1 for text-only, 1,2 for image-adapter drafts)")
    g.add_argument("--steps", type=positive, default=1000, help="optimizer steps of stage 1")
    g.add_argument("--stage2-steps", type=positive, help="optimizer steps of stage 2 (default: --steps)")
    g.add_argument("--batch-size", type=positive, default=8,
                   help="examples per micro-batch PER PROCESS (accelerate's per-device convention): under accelerate "
                        "launch / torchrun an optimizer step trains this × processes × --grad-accum examples")
    g.add_argument("--grad-accum", type=positive, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=number_in(0.0, low_open=True), default=1e-3, help="peak learning rate (> 0)")
    g.add_argument("--stage2-lr", type=number_in(0.0, low_open=True),
                   help="adapter learning rate in stage 2, > 0 (default: --lr)")
    g.add_argument("--stage2-lm-lr", type=number_in(0.0),
                   help="LM learning rate in stage 2, >= 0 (default: --lr / 3; 0: frozen)")
    g.add_argument("--feature-loss-weight", type=number_in(0.0), default=1.0,
                   help="feature_head drafts: weight of the smooth-L1 regression of the target's next hidden state")
    g.add_argument("--token-loss-weight", type=number_in(0.0), default=0.1,
                   help="feature_head drafts: weight of the token loss (--loss) through the target's LM head")
    g.add_argument("--variant", choices=("eagle1", "eagle3"), default=None,
                   help="feature_head drafts: eagle3 = EAGLE-3 head on three target layers (the kind eagle3); "
                        "default: eagle1 (the EAGLE-1 head on the last layer)")
    g.add_argument("--ttt-steps", type=positive, default=None,
                   help="eagle3 heads: training-time-test steps unrolled on the head's own outputs (default: 3; "
                        "refused for other kinds)")
    g.add_argument("--ttt-decay", type=number_in(0.0, low_open=True), default=None,
                   help="eagle3 heads: weight of TTT step k is this ** k (default: 1.0; refused for other kinds)")
    g.add_argument("--draft-vocab-size", type=positive, default=None,
                   help="eagle3 heads: LM-head rows (the most frequent target ids of the training answers; "
                        "default: the whole vocabulary)")
    g.add_argument("--block-size", type=positive, default=None,
                   help="dflash drafters: the block one drafter forward denoises, >= 2 (proposes up to block - 1; default 8)")
    g.add_argument("--target-layers", type=int, nargs="+", default=None,
                   help="dflash drafters: target layers whose outputs it reads (default: second, middle, second to last)")
    g.add_argument("--anchors", type=positive, default=None,
                   help="dflash drafters: answer tokens drawn per line and step as block anchors (default: 8)")
    g.add_argument("--mm-share-start", type=number_in(0.0, 1.0), default=0.5,
                   help="stage 2: first share of image lines per step, in [0, 1] (ramped to 1.0)")
    g.add_argument("--warmup-steps", type=at_least_0, default=0, help="linear learning-rate warm-up steps")
    g.add_argument("--weight-decay", type=number_in(0.0), default=0.0, help="AdamW weight decay (>= 0)")
    g.add_argument("--max-grad-norm", type=number_in(0.0, low_open=True), default=1.0,
                   help="gradient clipping norm (> 0)")
    g.add_argument("--seed", type=at_least_0, default=0, help="seed of initialisation, data order and sampling")
    g.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: autocast (draft weights stay fp32, the frozen target is loaded in bf16)")
    g.add_argument("--device", type=device_name, default="cpu", help="cpu or cuda (under a launcher: each process's own GPU)")
    g.add_argument("--target-device-map", type=_device_map,
                   help="dispatch the frozen target with accelerate instead of loading it whole on --device: auto "
                        "(over the GPUs; under a launcher each process takes an equal share of them) or a JSON "
                        "{module: device|cpu|disk} map (default: off)")
    g = parser.add_argument_group("checkpoints")
    g.add_argument("--checkpoint-every", type=at_least_0, default=0,
                   help="optimizer steps between checkpoints (0: end of each stage)")
    g.add_argument("--keep-checkpoints", type=positive, default=2, help="most recent checkpoints kept on disk")
    g.add_argument("--resume", nargs="?", const="latest",
                   help="resume from the latest checkpoint in --output-dir (no value) or from PATH "
                        "(default: start fresh)")
    g.add_argument("--stop-at-step", type=positive,
                   help="stop with a checkpoint at this global step, resume later (default: run to the end)")
    g = parser.add_argument_group("evaluation and publishing")
    g.add_argument("--eval-data", help="held-out JSONL (default: --eval-fraction of --data)")
    g.add_argument("--eval-fraction", type=number_in(0.0, 1.0, high_open=True), default=0.1,
                   help="share of --data held out when --eval-data is not given, in [0, 1)")
    g.add_argument("--gamma", dest="eval_gamma", type=positive, default=5, help="γ for the held-out τ")
    g.add_argument("--eval-max-new-tokens", type=positive,
                   help="answer tokens per held-out prompt (default: --max-new-tokens)")
    g.add_argument("--eval-batch-size", type=positive, default=8, help="held-out prompts per batch")
    g.add_argument("--no-eval-before", dest="eval_before", action="store_false",
                   help="skip measuring the untrained draft (default: measure it)")
    g.add_argument("--task-name", help="results key in the model card (default: held-out <data file stem>)")
    g.add_argument("--target-name", help="the target's Hub id to record in the card (default: --target)")
    g.add_argument("--push-to-hub", metavar="ORG/NAME", type=_hub_repo, help="push the trained draft to this Hub repo "
                   "(default: do not push)")
    g.add_argument("--hub-private", action="store_true", help="make the pushed repo private")
    g.add_argument("--hub-token", help="Hub token for --push-to-hub (default: the logged-in one)")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars (default: show them)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="let the --target / --draft checkpoints run their own Python code (their config's auto_map); "
                        "read that code first (default: never run it)")


def config_from_args(args: argparse.Namespace) -> Any:
    import dataclasses

    from .config import TrainConfig

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in names})


def run(args: argparse.Namespace) -> int:
    """Train, print the held-out τ before / after and where the draft went. Input errors exit with 2."""
    from ..errors import SpecMMError
    from .run import train_draft

    try:
        result = train_draft(config_from_args(args), echo=print)  # prints the run's plan before any forward
    except SpecMMError as err:
        print(f"hf-specmm train: error: {err}", file=sys.stderr)
        return 2
    if os.environ.get("RANK", "0") != "0":  # under a launcher every process holds the same results: print once
        return 0
    summary = result.summary()
    for name in ("tau_before", "tau_after"):
        m = summary[name]
        if m:
            print(f"{name}: τ={m['block_efficiency']:.3f} acceptance={m['acceptance_rate']:.3f} "
                  f"(γ={m['gamma']}, {m['prompts']} held-out prompts)")
    print(f"{result.train_tokens} answer tokens in {result.train_time_s:.1f} s "
          f"({result.seconds_per_1k_tokens:.3f} s per 1k tokens)")
    print(json.dumps(summary, default=str))
    return 0
