"""Rebuild the miniature-world checkpoints (what ships in hf_specmm/world/checkpoints) from nothing, on CPU.

Deterministic recipe (hf_specmm.world.recipe): world seed 0 → target trained from scratch → text-only and
image-adapter drafts distilled from it with hf_specmm.train. About 13 minutes on 2 CPU cores.

By default everything is written under --work-dir (checkpoints in <work-dir>/checkpoints); the checkpoints
shipped inside the package are replaced only when asked explicitly.

    python examples/train_world.py                            # world_work/, checkpoints in world_work/checkpoints
    hf-specmm demo --checkpoints world_work/checkpoints       # the demo on the rebuilt checkpoints
    python examples/train_world.py --ship-dir my_ckpts        # checkpoints in my_ckpts/
    python examples/train_world.py --overwrite-shipped        # replace hf_specmm/world/checkpoints
    python examples/train_world.py --feature-head-only --overwrite-shipped --per-task 300 --steps 500
                                         # only the feature head, on the shipped target (what shipped it)
    python examples/train_world.py --eagle3-head-only --overwrite-shipped --per-task 300 --steps 500
                                         # only the EAGLE-3 head: the same lines and steps as the feature head
    python examples/train_world.py --dflash-only --overwrite-shipped --per-task 300 --steps 500
                                         # only the DFlash drafter: the same lines, 2 x 500 steps in its one stage
    python examples/train_world.py --mtp-only --overwrite-shipped --per-task 300 --steps 500
                                         # only the MTP layer: the same lines and steps as the feature head
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from hf_specmm.cli import HelpFormatter
from hf_specmm.world.recipe import build_draft_checkpoint, build_world_checkpoints
from hf_specmm.world.shipped import CHECKPOINTS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--work-dir", default="world_work", help="world images, answer cache, training runs")
    parser.add_argument("--ship-dir", default=None,
                        help="where the checkpoints + cards are written (default: <work-dir>/checkpoints)")
    parser.add_argument("--overwrite-shipped", action="store_true",
                        help=f"write into the package's own checkpoints, {CHECKPOINTS}, replacing the shipped ones")
    parser.add_argument("--feature-head-only", action="store_true",
                        help="train only the feature head on the target already in the ship dir")
    parser.add_argument("--eagle3-head-only", action="store_true",
                        help="train only the EAGLE-3 head on the target already in the ship dir")
    parser.add_argument("--dflash-only", action="store_true",
                        help="train only the DFlash drafter on the target already in the ship dir")
    parser.add_argument("--mtp-only", action="store_true",
                        help="train only the MTP layer on the target already in the ship dir")
    parser.add_argument("--per-task", type=int, default=None,
                        help="--*-only: the first N distillation lines of each task (default: all)")
    parser.add_argument("--steps", type=int, default=None,
                        help="--*-only: optimizer steps per stage of the two-stage heads; the one-stage DFlash "
                             "drafter trains 2 x N (default: the recipe's)")
    return parser


def ship_dir_for(args: argparse.Namespace) -> Path:
    """Where the checkpoints go: the package folder only with --overwrite-shipped or an explicit --ship-dir."""
    if args.overwrite_shipped:
        if args.ship_dir is not None and Path(args.ship_dir).resolve() != CHECKPOINTS.resolve():
            raise SystemExit("train_world.py: error: --overwrite-shipped writes to the shipped checkpoints; "
                             f"drop --ship-dir {args.ship_dir} or --overwrite-shipped")
        return CHECKPOINTS
    return Path(args.ship_dir) if args.ship_dir is not None else Path(args.work_dir) / "checkpoints"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ship_dir = ship_dir_for(args)
    torch.set_num_threads(2)  # the recipe's numbers were measured on 2 cores; float sums depend on the split
    only = [kind for kind, flag in (("feature_head", args.feature_head_only), ("eagle3", args.eagle3_head_only),
                                    ("dflash", args.dflash_only), ("mtp", args.mtp_only)) if flag]
    if len(only) > 1:
        raise SystemExit("train_world.py: error: give one of --feature-head-only, --eagle3-head-only, --dflash-only "
                         "and --mtp-only")
    if only:
        result = build_draft_checkpoint(only[0], args.work_dir, ship_dir, args.per_task, args.steps)
        print(json.dumps({k: result["summary"][k] for k in ("tau_before", "tau_after")}, indent=1))
        return 0
    summary = build_world_checkpoints(args.work_dir, ship_dir)
    target = summary["target"]
    print(json.dumps({"target_heldout_accuracy": target["heldout_accuracy"],
                      "shuffled_images": target["heldout_accuracy_shuffled_images"],
                      "drafts": {k: {"tau_before": v["summary"]["tau_before"], "tau_after": v["summary"]["tau_after"]}
                                 for k, v in summary["drafts"].items()}}, indent=1))
    shipped = ship_dir.resolve() == CHECKPOINTS.resolve()
    demo = "" if shipped else f"; run the demo on them: hf-specmm demo --checkpoints {ship_dir}"
    print(f"checkpoints written to {ship_dir}{demo}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
