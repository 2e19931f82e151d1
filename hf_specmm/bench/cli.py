"""``hf-specmm bench``: plain vs stock-assisted vs hf_specmm, side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .presets import PRESETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=PRESETS, default="cpu-proxy",
                        help="target+draft built from configs (random weights, no download)")
    parser.add_argument("--gammas", type=int, nargs="+", default=[5], help="block sizes γ to measure")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    parser.add_argument("--acceptance", type=float, default=None,
                        help="controlled acceptance α (systems benchmark: the draft's real forward runs, its "
                             "proposal is the target's token with probability α); greedy only")
    parser.add_argument("--do-sample", action="store_true")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32, help="text tokens per synthetic prompt")
    parser.add_argument("--no-image", action="store_true", help="text-only synthetic prompts")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-stock", action="store_true", help="skip stock transformers assisted generation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for bench.json/.md/.png")


def run(args: argparse.Namespace) -> int:
    import torch

    from .runner import BenchConfig, format_table, run_benchmark, write_outputs

    if args.acceptance is not None and args.do_sample:
        raise SystemExit("hf-specmm bench: --acceptance is for greedy decoding; drop --do-sample")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"hf-specmm bench: --device {args.device} but CUDA is not available")
    config = BenchConfig(preset=args.preset, gammas=args.gammas, batch_sizes=args.batch_sizes,
                         acceptance=args.acceptance, do_sample=args.do_sample, max_new_tokens=args.max_new_tokens,
                         prompt_tokens=args.prompt_tokens, with_image=not args.no_image, device=args.device,
                         dtype=args.dtype, warmup=args.warmup, repeats=args.repeats, stock=not args.no_stock,
                         seed=args.seed)
    result = run_benchmark(config)
    paths = write_outputs(result, args.out)
    print(format_table(result))
    for row in result["rows"]:
        if row["stock_error"]:
            print(f"stock assisted generation n/a at batch {row['batch']}, γ={row['gamma']}: {row['stock_error']}")
    if result["env"]["note"]:
        print(f"note: {result['env']['note']}")
    print(json.dumps({k: v for k, v in result["env"].items() if k != "config"}))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
