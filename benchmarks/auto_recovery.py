"""How many calls hf_specmm.Auto needs to come back from a calibration timed in a slow spell, on the shipped world.

The first CALIBRATION_SAMPLES timings of one kind's drafted rounds (``--kind chain``: every chain's block width
above 1 and every chain's drafting) are recorded ``--factor`` times what they took, as if the machine had been
that much slower while that kind was calibrated; everything after is timed as it runs. The draft is the world's
text-only one at batch 8 by default, where chain 2 runs 1.2-1.3x faster than the trees (docs/benchmarks.md), so a
slow chain calibration ranks trees first. Per call: the kind of most of its rounds ('plain generate' for a call run
whole as plain generate). Reported: the first call from which every later speculative call's rounds are mostly
of the kind that is best when nothing is inflated (``--best-kind``), or null if that never happens within
``--calls`` (calls run as plain generate are left out: Auto's checks run one now and then), and how many of the
last 16 calls ran as plain generate.

    PYTHONPATH=. python benchmarks/auto_recovery.py --factor 1.4 --out benchmarks/results/auto/recovery/1.json
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import hf_specmm
from hf_specmm.auto.costs import CALIBRATION_SAMPLES, CostTable
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS


def slow_calibration(kind: str, factor: float) -> None:
    """Record the first timings of ``kind``'s drafted rounds ``factor`` times what they took (see the module)."""
    add = CostTable.add

    def inflated(self: CostTable, round_kind: str, width: int, draft_label: str | None, draft_s: float,
                 verify_s: float) -> None:
        if round_kind == kind and draft_label is not None and \
                len(self.verify[round_kind].get(width, [])) < CALIBRATION_SAMPLES:
            draft_s, verify_s = draft_s * factor, verify_s * factor
        add(self, round_kind, width, draft_label, draft_s, verify_s)

    CostTable.add = inflated  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", default="text-only (distilled)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--calls", type=int, default=48)
    parser.add_argument("--kind", choices=("chain", "tree"), default="chain", help="the kind calibrated slow")
    parser.add_argument("--factor", type=float, default=1.4)
    parser.add_argument("--best-kind", choices=("chain", "tree"), default="chain")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    slow_calibration(args.kind, args.factor)
    world = load_world_models()
    target, processor = world.target, world.processor
    hf_specmm.enable(target)
    examples = [e for task in eval_examples(3).values() for e in task][:8]
    inputs = [encode_prompts(processor, examples[i:i + args.batch], "raw", target.device)
              for i in range(0, len(examples), args.batch)]
    auto = hf_specmm.Auto(world.drafts[args.draft], max_tokens=64)
    calls = []
    for c in range(args.calls):
        target.generate(**inputs[c % len(inputs)], max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False,
                        assistant_model=auto)
        stats = hf_specmm.last_stats(target).auto
        rounds_by_kind = collections.Counter("plain generate" if s == "plain generate" else "plain" if s == "plain"
                                             else s.split()[0] for s in stats["shapes"])
        calls.append({"kind": rounds_by_kind.most_common(1)[0][0], "shapes": dict(collections.Counter(stats["shapes"])),
                      "calibration_rounds": stats["calibration_rounds"]})
    kinds = [x["kind"] for x in calls]
    back = next((c for c in range(len(kinds)) if kinds[c] == args.best_kind and
                 all(k in (args.best_kind, "plain generate") for k in kinds[c:])), None)
    result = {"draft": args.draft, "batch": args.batch, "kind": args.kind, "factor": args.factor,
              "back_on_best_kind_from_call": back, "plain_generate_in_last_16": kinds[-16:].count("plain generate"),
              "kinds": kinds, "calls": calls}
    print(json.dumps({k: v for k, v in result.items() if k != "calls"}))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
