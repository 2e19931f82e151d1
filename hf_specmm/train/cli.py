"""``hf-specmm train``: the command line over :func:`hf_specmm.train.train_draft` (one flag per TrainConfig field).

    hf-specmm train --target llava-hf/llava-1.5-7b-hf --draft-config vicuna-68m --data data.jsonl --images imgs/ \\
        --output-dir runs/d1 --steps 2000 --batch-size 16 --dtype bf16 --device cuda --checkpoint-every 200
    hf-specmm train ... --resume                    # continue from the latest checkpoint in --output-dir
    hf-specmm train ... --draft-kind image_adapter --stages 1,2 --stage2-lm-lr 1e-5 --push-to-hub me/llava-draft
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # argparse is used only when the dispatcher builds the parser
    import argparse


def _stages(text: str) -> tuple[int, ...]:
    import argparse

    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--stages takes e.g. 1,2 or 2 (got {text!r})") from err


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the train flags on ``parser`` (called by ``hf_specmm.cli``)."""
    g = parser.add_argument_group("inputs")
    g.add_argument("--target", required=True, help="target Hub id or local folder (model + processor)")
    g.add_argument("--data", required=True, help='JSONL lines {"image": path|null, "prompt": ..., "response": ...}')
    g.add_argument("--images", help="folder relative image paths are resolved against (default: the JSONL's folder)")
    g.add_argument("--output-dir", required=True, help="checkpoints, the final draft (draft/) and train_summary.json")
    g.add_argument("--draft", help="draft to start from (Hub id or path, loaded with hf_specmm.load_draft)")
    g.add_argument("--draft-config", help="build a fresh draft: preset (tiny, small, vicuna-68m), JSON file or JSON "
                   "text with num_hidden_layers, hidden_size, num_attention_heads [, intermediate_size, model_type]")
    g.add_argument("--draft-kind", choices=("text_only", "image_adapter"))
    g.add_argument("--image-pool", type=int, default=1, help="adapter drafts built here: pool visual tokens ×k")
    g.add_argument("--prompt-format", choices=("auto", "chat", "raw"), default="auto")
    g = parser.add_argument_group("target answers")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--sample", dest="do_sample", action="store_true", help="sample the answers (default: greedy)")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--gen-batch-size", type=int, default=8)
    g.add_argument("--response-cache", help="JSONL cache of answers (default: next to --output-dir)")
    g = parser.add_argument_group("optimisation")
    g.add_argument("--loss", choices=("kl", "tvd", "ce"), default="kl")
    g.add_argument("--stages", type=_stages, help="1 (language), 2 (multimodal: adapter drafts) or 1,2")
    g.add_argument("--steps", type=int, default=1000, help="optimizer steps of stage 1")
    g.add_argument("--stage2-steps", type=int, help="optimizer steps of stage 2 (default: --steps)")
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--stage2-lr", type=float, help="adapter learning rate in stage 2 (default: --lr)")
    g.add_argument("--stage2-lm-lr", type=float, help="LM learning rate in stage 2 (default: --lr / 3; 0: frozen)")
    g.add_argument("--mm-share-start", type=float, default=0.5, help="stage 2: first share of image lines (→ 1.0)")
    g.add_argument("--warmup-steps", type=int, default=0)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--max-grad-norm", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    g.add_argument("--device", default="cpu", help="cpu or cuda")
    g = parser.add_argument_group("checkpoints")
    g.add_argument("--checkpoint-every", type=int, default=0, help="optimizer steps (0: end of each stage)")
    g.add_argument("--keep-checkpoints", type=int, default=2)
    g.add_argument("--resume", nargs="?", const="latest", help="resume from the latest checkpoint or from PATH")
    g.add_argument("--stop-at-step", type=int, help="stop with a checkpoint at this global step (resume later)")
    g = parser.add_argument_group("evaluation and publishing")
    g.add_argument("--eval-data", help="held-out JSONL (default: --eval-fraction of --data)")
    g.add_argument("--eval-fraction", type=float, default=0.1)
    g.add_argument("--gamma", dest="eval_gamma", type=int, default=5, help="γ for the held-out τ")
    g.add_argument("--eval-max-new-tokens", type=int)
    g.add_argument("--eval-batch-size", type=int, default=8)
    g.add_argument("--no-eval-before", dest="eval_before", action="store_false",
                   help="skip measuring the untrained draft")
    g.add_argument("--task-name", help="results key in the model card")
    g.add_argument("--target-name", help="the target's Hub id to record in the card (default: --target)")
    g.add_argument("--push-to-hub", metavar="ORG/NAME")
    g.add_argument("--hub-private", action="store_true")
    g.add_argument("--hub-token")
    g.add_argument("--no-progress", dest="progress", action="store_false")


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
        result = train_draft(config_from_args(args))
    except SpecMMError as err:
        print(f"hf-specmm train: error: {err}", file=sys.stderr)
        return 2
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
