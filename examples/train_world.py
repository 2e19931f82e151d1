"""Rebuild the shipped miniature-world checkpoints (hf_specmm/world/checkpoints) from nothing, on CPU.

Deterministic recipe (hf_specmm.world.recipe): world seed 0 → target trained from scratch → text-only and
image-adapter drafts distilled from it with hf_specmm.train. About 10 minutes on 2 CPU cores.

    python examples/train_world.py                       # work files in world_work/, checkpoints replaced
    python examples/train_world.py --ship-dir my_ckpts   # keep the shipped ones
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_specmm.world.recipe import build_world_checkpoints
from hf_specmm.world.shipped import CHECKPOINTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default="world_work", help="world images, answer cache, training runs")
    parser.add_argument("--ship-dir", default=str(CHECKPOINTS), help="where the checkpoints + cards are written")
    args = parser.parse_args()
    torch.set_num_threads(2)  # the recipe's numbers were measured on 2 cores; float sums depend on the split
    summary = build_world_checkpoints(args.work_dir, args.ship_dir)
    target = summary["target"]
    print(json.dumps({"target_heldout_accuracy": target["heldout_accuracy"],
                      "shuffled_images": target["heldout_accuracy_shuffled_images"],
                      "drafts": {k: {"tau_before": v["summary"]["tau_before"], "tau_after": v["summary"]["tau_after"]}
                                 for k, v in summary["drafts"].items()}}, indent=1))


if __name__ == "__main__":
    main()
