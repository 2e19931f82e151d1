"""``hf-specmm bench``: plain vs stock-assisted vs hf_specmm, side by side."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecMMError
from .config import ACCEPTANCE_DRAWS
from .presets import DEVICE_MAPS, DRAFT_KINDS, PRESETS

if TYPE_CHECKING:  # argparse is used only when the dispatcher builds the parser
    import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the bench flags on ``parser`` (called by ``hf_specmm.cli``). Numbers are range-checked by
    their ``type=`` so that a bad value is a one-line usage error before any model is built."""
    from ..cli import device_name, int_at_least, number_in, tree_shape

    parser.add_argument("--preset", choices=PRESETS, default="cpu-proxy",
                        help="target+draft built from configs (random weights, no download)")
    parser.add_argument("--draft-kind", dest="draft_kinds", choices=DRAFT_KINDS, nargs="+", default=["text_only"],
                        help="draft(s) to run, each timed side by side with the others on the same inputs and "
                             "acceptance pattern: text_only = the preset's small LM, feature_head = a randomly "
                             "initialised one-layer FeatureHeadDraft on the target's features, dflash = a random "
                             "one-layer DFlash drafter, gemma4_assistant = a random Gemma 4 assistant fitted to the "
                             "target (tiny-gemma4 only), mtp = a random MTP layer of the target's shape (a Qwen3.5 "
                             "checkpoint's) (default: text_only)")
    parser.add_argument("--mtp-layers", type=int_at_least(1), default=1,
                        help="MTP layers of the mtp kind's draft (draft step k runs layer k, later steps the last; "
                             "Step3.7 checkpoints carry 3) (default: 1)")
    parser.add_argument("--gammas", type=int_at_least(1), nargs="+", default=[5],
                        help="block sizes γ to measure (draft tokens per round, each >= 1)")
    parser.add_argument("--batch-sizes", type=int_at_least(1), nargs="+", default=[1],
                        help="batch sizes to measure (each >= 1; stock assisted generation runs at batch 1 only)")
    parser.add_argument("--acceptance", type=number_in(0.0, 1.0), default=None,
                        help="controlled acceptance α in [0, 1] (systems benchmark: the draft's real forward runs, "
                             "its proposal is the target's token with probability α); greedy only "
                             "(default: off, the draft's own proposals)")
    parser.add_argument("--acceptance-profile", type=_profile, default=None, metavar="PROFILE",
                        help="rank-aware controlled acceptance: the target's token is the draft's r-th choice at depth d "
                             "with probability p[d][r], given as 'p11,p12,..;p21,..' (depths split by ';') or a JSON "
                             "file (hf-specmm world-tau --profile writes one per draft); trees gain τ under it as with "
                             "trained drafts; greedy only, not with --acceptance (default: off)")
    parser.add_argument("--acceptance-draws", choices=ACCEPTANCE_DRAWS, default="fixed",
                        help="with --acceptance or --acceptance-profile: fixed = one accept/reject pattern per (row, "
                             "position) in every call; per-call = the k-th timed call of every method draws pattern k, "
                             "so a row is an average over patterns, not how one pattern lines up with a shape's rounds "
                             "(at batch 1 one prompt's 40 draws ran chain 7 at τ 4.88 against the profile's 4.05); "
                             "every method still sees the same pattern in the same turn (default: fixed)")
    parser.add_argument("--auto", action="store_true",
                        help="also time hf_specmm.Auto(draft) for every draft kind, in turns with each batch's first γ "
                             "(untimed calls first until its cost calibration is done: Auto measures costs once per "
                             "process)")
    parser.add_argument("--auto-max-tokens", type=int_at_least(1), default=64,
                        help="Auto's max_tokens (most tree nodes a round may draft; default 64)")
    parser.add_argument("--auto-eval-repeats", type=int_at_least(0), default=0, metavar="N",
                        help="with --auto: then re-time each draft kind's best grid row (chain or tree) in turns beside "
                             "Auto and plain, N passes, for an Auto / best ratio free of the best-of-many bias of picking "
                             "the fastest of noisy rows (default 0: no evaluation)")
    parser.add_argument("--auto-warmup-calls", type=int_at_least(0), default=0, metavar="N",
                        help="with --auto-eval-repeats: N untimed Auto calls after its calibration, before the "
                             "evaluation's passes: what a process that has served N calls runs (Auto learns acceptance "
                             "across calls; the grid pass's Auto row shows its first calls) (default 0)")
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--max-new-tokens", type=int_at_least(1), default=64, help="tokens generated per row")
    parser.add_argument("--prompt-tokens", type=int_at_least(1), default=32, help="text tokens per synthetic prompt")
    parser.add_argument("--no-image", action="store_true", help="text-only synthetic prompts")
    parser.add_argument("--device", type=device_name, default="cpu",
                        help="torch device (cpu, cuda, cuda:1, ...) of the target and the draft; with --device-map "
                             "of the draft only (default: cpu)")
    parser.add_argument("--device-map", choices=DEVICE_MAPS, default=None,
                        help="auto: spread the target's layers over the visible GPUs (then CPU RAM) with accelerate, "
                             "as from_pretrained(device_map='auto') does, to time a target larger than one GPU; the "
                             "draft and inputs stay on --device (default: off, the whole target on --device)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="weights' dtype (default: the preset's own, float32 for cpu-proxy and the tiny "
                             "presets, bfloat16 for llava-1.5-7b-shape and qwen2.5-vl-7b-shape)")
    parser.add_argument("--warmup", type=int_at_least(0), default=1, help="untimed runs of each method first")
    parser.add_argument("--repeats", type=int_at_least(1), default=3,
                        help="timed runs of each method, interleaved (the median is reported)")
    parser.add_argument("--no-stock", action="store_true", help="skip stock transformers assisted generation")
    parser.add_argument("--tree", type=tree_shape, action="append", default=[], metavar="K,D,N",
                        help="also time hf_specmm.Tree(draft, top_k=K, depth=D, nodes=N) for every draft kind, in turns "
                             "with each batch's first γ (repeatable); under --acceptance a tree's top path follows the "
                             "chain's draws, its other children miss (see hf_specmm.bench.controlled)")
    parser.add_argument("--compile", action="store_true",
                        help="also time plain generate and hf_specmm with a static cache and torch.compile (stock's "
                             "cache_implementation='static' + compile_config), beside the eager rows")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="seed of weights, prompts and acceptance draws")
    parser.add_argument("--out", type=_out_folder, default=Path("bench-results"),
                        help="folder for bench.json/.md/.png (checked writable before any work)")
    parser.add_argument("--write-profile", type=_profile_file, metavar="P.json",
                        help="also write an hf-specmm auto-sim profile from the fixed-shape rows' timings (the first "
                             "draft kind; docs/auto.md; default: none written)")


def _out_folder(text: str) -> Path:
    from ..cli import output_folder

    return Path(output_folder(text))


def _profile_file(text: str) -> Path:
    from ..cli import output_file

    return Path(output_file(text))


def _profile(text: str) -> list[list[float]]:
    """An argparse ``type=`` for ``--acceptance-profile`` (numbers or a JSON file), checked."""
    import argparse

    from ..auto.acceptance import check_profile

    try:
        profile = read_profile(text)
        check_profile(profile, "--acceptance-profile")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return profile


def read_profile(text: str) -> list[list[float]]:
    """A profile from ``"p11,p12,...;p21,..."`` (depths split by ``;``, ranks by ``,``) or from a JSON file (a
    list of depths, or an object with a ``"profile"`` list: what ``hf-specmm world-tau --profile`` writes)."""
    if Path(text).suffix == ".json" or os.path.isfile(text):  # isfile: False for names too long to be paths
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"profile file {text!r} does not exist")
        data: Any = json.loads(path.read_text())
        profile = data.get("profile") if isinstance(data, dict) else data
        if not isinstance(profile, list):
            raise ValueError(f"profile file {text!r} holds no profile (a list of depths, or {{'profile': [...]}})")
        return [[float(p) for p in row] for row in profile]
    try:
        return [[float(p) for p in depth.split(",") if p.strip()] for depth in text.split(";") if depth.strip()]
    except ValueError:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ValueError(f"expected probabilities by rank, depths split by ';' (e.g. 0.7,0.1;0.6,0.1) or a .json "
                         f"file, got {shown!r}") from None


def _refuse(message: str) -> SystemExit:
    """Errors found after parsing (they need torch or the file system): one line, exit code 2."""
    import sys

    print(f"hf-specmm bench: error: {message}", file=sys.stderr)
    return SystemExit(2)


def run(args: argparse.Namespace) -> int:
    import argparse

    import torch

    from ..cli import check_writable

    from .report import format_table, write_outputs
    from .runner import BenchConfig, run_benchmark

    # checked before any model is built: each of these would otherwise fail minutes later
    if len(set(args.draft_kinds)) != len(args.draft_kinds):
        raise _refuse(f"--draft-kind {' '.join(args.draft_kinds)} names a kind twice")
    if args.mtp_layers != 1 and "mtp" not in args.draft_kinds:
        raise _refuse(f"--mtp-layers {args.mtp_layers} sizes the mtp kind's draft: add mtp to --draft-kind")
    if args.acceptance is not None and args.do_sample:
        raise _refuse("--acceptance is for greedy decoding; drop --do-sample")
    if args.acceptance_draws != "fixed" and args.acceptance is None and args.acceptance_profile is None:
        raise _refuse(f"--acceptance-draws {args.acceptance_draws} is for controlled acceptance: add --acceptance or "
                      "--acceptance-profile")
    if args.auto_warmup_calls and not (args.auto and args.auto_eval_repeats):
        raise _refuse(f"--auto-warmup-calls {args.auto_warmup_calls} warms Auto up before its evaluation: add --auto "
                      "and --auto-eval-repeats N")
    if args.acceptance_profile is not None and (args.do_sample or args.acceptance is not None or args.compile):
        raise _refuse("--acceptance-profile is for greedy, eager runs: drop --do-sample / --acceptance / --compile")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise _refuse(f"--device {args.device} but CUDA is not available")
    if args.device_map is not None and torch.cuda.is_available() and not args.device.startswith("cuda"):
        raise _refuse(f"--device-map {args.device_map} spreads the target over the GPUs: put the draft on one too "
                      "(--device cuda)")
    if importlib.util.find_spec("matplotlib") is None:
        raise _refuse("bench.png is drawn with matplotlib: pip install 'hf-specmm[bench]'")
    try:
        config = BenchConfig(preset=args.preset, gammas=args.gammas, batch_sizes=args.batch_sizes,
                             acceptance=args.acceptance, do_sample=args.do_sample, max_new_tokens=args.max_new_tokens,
                             prompt_tokens=args.prompt_tokens, with_image=not args.no_image, device=args.device,
                             device_map=args.device_map,
                             dtype=args.dtype, warmup=args.warmup, repeats=args.repeats, stock=not args.no_stock,
                             seed=args.seed, draft_kinds=args.draft_kinds, mtp_layers=args.mtp_layers,
                             compile=args.compile,
                             trees=[[shape.top_k, shape.depth, shape.nodes] for shape in args.tree],
                             acceptance_profile=args.acceptance_profile, auto=args.auto,
                             auto_max_tokens=args.auto_max_tokens, auto_eval_repeats=args.auto_eval_repeats,
                             auto_warmup_calls=args.auto_warmup_calls, acceptance_draws=args.acceptance_draws)
        config.validate()
    except ValueError as err:  # BenchConfig's own checks (e.g. a draft kind the preset's target cannot take)
        raise _refuse(str(err)) from None
    try:  # made now, before any model is built (a given --out / --write-profile was checked while parsing)
        check_writable(args.out, "--out folder", create=True)
        if args.write_profile is not None:
            check_writable(args.write_profile.parent, "--write-profile folder", create=True)
    except argparse.ArgumentTypeError as error:
        raise _refuse(str(error)) from None
    try:
        result = run_benchmark(config)
    except SpecMMError as err:  # e.g. a --tree wider than the preset's vocabulary: refused before that call's forward
        raise _refuse(str(err)) from None
    paths = write_outputs(result, args.out)
    if args.write_profile is not None:
        import sys

        from .sim_profile import profile_from_rows

        given = config.acceptance_profile if config.acceptance_profile is not None else config.acceptance
        command = "hf-specmm bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "hf-specmm bench"
        try:
            profile = profile_from_rows(result["rows"], result["rows"][0]["draft_kind"], given, command)
        except ValueError as err:  # the run's own results are written: say so
            raise _refuse(f"--write-profile {args.write_profile}: {err} (the run's results: {args.out})") from None
        args.write_profile.write_text(json.dumps(profile, indent=1) + "\n")
    print(format_table(result))
    for row in result["rows"]:
        if row.get("stock_error"):
            print(f"stock assisted generation n/a at batch {row['batch']}, γ={row['gamma']}: {row['stock_error']}")
    if result["env"]["note"]:
        print(f"note: {result['env']['note']}")
    print(json.dumps({k: v for k, v in result["env"].items() if k != "config"}))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
