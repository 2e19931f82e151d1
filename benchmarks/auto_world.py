"""hf_specmm.Auto beside every fixed shape of the grid on the shipped miniature world (trained drafts, real
acceptance): wall time of greedy generation over held-out scenes, per draft and batch size.

    PYTHONPATH=. python benchmarks/auto_world.py --batch-sizes 1 8 --runs 5 --out /tmp/auto-world

Each method generates the same prompts (batch 1: the prompts one by one; batch 8: one batch of 8). Fair by
construction on a machine whose speed drifts (the world's calls last ~0.1 s; on these shared cores the same
plain pass drifts by up to 1.5x over a minute):

- **turns per prompt**: for every prompt batch, each method generates it once, in a rotating order, before the
  next prompt batch; a method's time per repeat is the sum over the prompt batches, so a slow spell is shared
  by every method;
- **selection, then evaluation**: the grid's best fixed shape is chosen from a first pass (plain, the 12 fixed
  shapes, Auto); then plain, that shape and Auto are timed again in a second pass, whose medians give Auto / best.
  The minimum of 12 noisy medians is biased low (the winner's curse); re-timing the chosen shape is not.
- **held-out selection** (``--heldout``): the grid is timed on as many other held-out scenes too, and the best
  fixed shape there is re-timed beside Auto as well. Greedy rounds are the same every pass, so the best shape
  on the evaluation prompts is in part fitted to them (how many rounds their longest answers take); one chosen
  on other prompts is the shape a user tuning by hand would have.

Auto is called untimed once over the prompts first (a process after its first calls; a fresh process is the
simulator's "first 20" figure). ``--runs N`` repeats the whole measurement N times (a fresh Auto each run) and
reports, per draft and batch, the min / median / max over runs of Auto / best fixed shape and of Auto / plain.
Every draft the world ships is measured by default, the untrained text-only draft (nothing accepted: the useless
draft) included. Reported per run: median seconds per method, Auto / best fixed shape, the shapes Auto took in one
more untimed pass, and how many of its evaluated (timed) calls ran as plain generate (``evaluated_auto_shapes`` in
the JSON: every shape those calls took; ``evaluated_whole_calls``: how each was chosen,
``last_stats(model).auto["whole_call"]``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

import torch

import hf_specmm
from hf_specmm.train.data import encode_prompts
from hf_specmm.cli import tree_shape
from hf_specmm.trees import TreeShape
from hf_specmm.world.shipped import DRAFT_NAMES, eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS
from hf_specmm.world.tasks import TASKS

CHAINS = (1, 2, 3, 4, 5, 6, 7, 8)
TREES = (TreeShape(2, 4, 8), TreeShape(4, 6, 24), TreeShape(8, 6, 48), TreeShape(8, 8, 64))
DRAFTS = tuple(DRAFT_NAMES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per call (batch 1: one after the other)")
    parser.add_argument("--repeats", type=int, default=3, help="passes of the selection (grid) timing")
    parser.add_argument("--eval-repeats", type=int, default=15, help="passes of the evaluation (plain, best, Auto)")
    parser.add_argument("--chains", type=int, nargs="*", default=list(CHAINS), help="the grid's chains (γ)")
    parser.add_argument("--trees", type=tree_shape, nargs="*", default=list(TREES), metavar="K,D,N",
                        help="the grid's trees (none: chains only)")
    parser.add_argument("--runs", type=int, default=1, help="whole measurements, each with a fresh Auto (the spread)")
    parser.add_argument("--drafts", nargs="+", default=list(DRAFTS), choices=DRAFTS, metavar="DRAFT",
                        help=f"the world's drafts (default: all: {', '.join(DRAFTS)})")
    parser.add_argument("--out", type=Path, required=True, help="the folder world_bench.json is written to")
    parser.add_argument("--heldout", action="store_true",
                        help="also choose a best fixed shape on as many other held-out scenes (task for task) and "
                             "re-time it beside Auto: a shape chosen on other prompts, as a user would choose one")
    args = parser.parse_args(argv)
    for name in ("prompts", "repeats", "eval_repeats", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    world = load_world_models()
    target, processor = world.target, world.processor
    examples, per_task = evaluation_examples(args.prompts)
    heldout = heldout_examples(examples, 2 * per_task) if args.heldout else []
    hf_specmm.enable(target)
    rows = []
    for run, batch in ((r, b) for r in range(args.runs) for b in args.batch_sizes):
        inputs, held_inputs = ([encode_prompts(processor, group[i:i + batch], "raw", target.device)
                                for i in range(0, len(group), batch)] for group in (examples, heldout))
        gen = dict(max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False)

        def call(assistant=None, **extra):
            def run(x):
                return target.generate(**x, **gen, **({"assistant_model": assistant} if assistant else {}), **extra)
            return run

        methods = {"plain": call()}
        autos = {}
        for name in args.drafts:
            draft = world.drafts[name]
            for g in args.chains:
                methods[f"{name} | chain {g}"] = call(draft, num_assistant_tokens=g)
            for s in args.trees:
                methods[f"{name} | tree {s.top_k},{s.depth},{s.nodes}"] = call(hf_specmm.Tree(draft, s.top_k, s.depth, s.nodes))
            autos[name] = hf_specmm.Auto(draft, max_tokens=64)
            methods[f"{name} | auto"] = call(autos[name])
        for auto in autos.values():  # untimed calls: a process after its first calls
            for x in inputs:
                target.generate(**x, **gen, assistant_model=auto)
        shapes = {name: Counter() for name in autos}
        timed = in_turns(methods, inputs, args.repeats)
        held_timed = in_turns(methods, held_inputs, args.repeats) if held_inputs else {}
        plain_out = timed["plain"][1]
        for name in args.drafts:
            for x in inputs:  # the shapes Auto takes now (one more untimed pass over the prompts)
                target.generate(**x, **gen, assistant_model=autos[name])
                shapes[name].update(hf_specmm.last_stats(target).auto["shapes"])
            fixed = {k: v[0] for k, v in timed.items() if k.startswith(f"{name} |") and not k.endswith("auto")}
            best = min(fixed, key=fixed.get)
            lossless = all(all(torch.equal(a, b) for a, b in zip(timed[k][1], plain_out))
                           for k in timed if k.startswith(f"{name} |"))
            timed_shapes = Counter()  # every shape Auto's evaluated calls took (a call as plain generate: one)
            whole_calls = Counter()  # how those calls were chosen: the rule, and plain generate or not

            def auto_recorded(x, run=methods[f"{name} | auto"], counts=timed_shapes, choices=whole_calls):
                out = run(x)
                report = hf_specmm.last_stats(target).auto
                counts.update(report["shapes"])
                chose = report["whole_call"]
                choices["no choice" if chose is None else
                        "plain generate" if chose["plain_generate"] else "speculative"] += 1
                return out

            evaluated = {"plain": methods["plain"], "best": methods[best], "auto": auto_recorded}
            held_best = min((k for k in fixed if k in held_timed), key=lambda k: held_timed[k][0], default=None)
            if held_best is not None and held_best != best:  # the shape chosen on the other scenes
                evaluated["heldout best"] = methods[held_best]
            again = in_turns(evaluated, inputs, args.eval_repeats)  # evaluation: the chosen shapes re-timed beside Auto
            plain_s, best_s, auto_s = again["plain"][0], again["best"][0], again["auto"][0]
            rows.append({"run": run, "draft": name, "batch": batch, "plain_s": plain_s, "auto_s": auto_s,
                         "best_fixed": best.split(" | ")[1], "best_fixed_s": best_s,
                         "auto_over_best": auto_s / best_s, "auto_speedup": plain_s / auto_s,
                         "best_speedup": plain_s / best_s,
                         "selection_pass": {"plain_s": timed["plain"][0], "auto_s": timed[f"{name} | auto"][0],
                                            "fixed_s": {k.split(" | ")[1]: v for k, v in fixed.items()}},
                         "eval_times_s": {k: v[2] for k, v in again.items()},  # every pass
                         "untimed_first_calls": len(inputs), "lossless": lossless,
                         "auto_shapes": dict(shapes[name].most_common(5)),
                         "evaluated_auto_shapes": dict(timed_shapes.most_common()),
                         "evaluated_whole_calls": dict(whole_calls.most_common()),
                         "evaluated_auto_calls": len(inputs) * (args.eval_repeats + 1)})
            r = rows[-1]
            if held_best is not None:
                held_s = again["heldout best"][0] if held_best != best else best_s
                r.update(heldout_best_fixed=held_best.split(" | ")[1], heldout_best_s=held_s,
                         auto_over_heldout_best=auto_s / held_s,
                         heldout_selection_pass={k.split(" | ")[1]: held_timed[k][0] for k in fixed})
            print(f"| {run} | {name} | {batch} | {plain_s:.3f} | {r['best_fixed']} {best_s:.3f} "
                  f"({r['best_speedup']:.2f}x) | {auto_s:.3f} ({r['auto_speedup']:.2f}x) | {r['auto_over_best']:.3f} | "
                  f"{', '.join(f'{k} ({v})' for k, v in r['auto_shapes'].items())} | "
                  f"{timed_shapes['plain generate']} / {r['evaluated_auto_calls']} | {lossless} |" +
                  (f" held out: {r['heldout_best_fixed']} {r['heldout_best_s']:.3f}, Auto / it "
                   f"{r['auto_over_heldout_best']:.3f} |" if held_best is not None else ""), flush=True)
    (args.out / "world_bench.json").write_text(json.dumps({"rows": rows, "threads": torch.get_num_threads(),
                                                          "prompts": args.prompts, "repeats": args.repeats,
                                                          "eval_repeats": args.eval_repeats}, indent=1))
    print("| draft | batch | runs | Auto / best: min, median, max | Auto / plain: min, median, max | lossless |")
    print("|---|---|---|---|---|---|")
    for name in args.drafts:
        for batch in args.batch_sizes:
            rs = [r for r in rows if r["draft"] == name and r["batch"] == batch]
            best = sorted(r["auto_over_best"] for r in rs)
            speedup = sorted(r["auto_speedup"] for r in rs)
            print(f"| {name} | {batch} | {len(rs)} | {best[0]:.3f}, {statistics.median(best):.3f}, {best[-1]:.3f} | "
                  f"{speedup[0]:.3f}, {statistics.median(speedup):.3f}, {speedup[-1]:.3f} | "
                  f"{all(r['lossless'] for r in rs)} |")
    print("median over rows of auto/best:", statistics.median(r["auto_over_best"] for r in rows))
    if heldout:
        print("median over rows of auto/held-out best:", statistics.median(r["auto_over_heldout_best"] for r in rows))


def evaluation_examples(prompts: int) -> tuple[list, int]:
    """The first ``prompts`` held-out scenes, task after task, and the scenes per task drawn for them (every task
    of the world's :data:`TASKS` gets ``ceil(prompts / len(TASKS))``)."""
    per_task = -(-prompts // len(TASKS))
    examples = [e for task in eval_examples(per_task).values() for e in task][:prompts]
    if len(examples) < prompts:
        raise SystemExit(f"--prompts {prompts}: the evaluation world drew only {len(examples)} scenes")
    return examples, per_task


def heldout_examples(examples: list, per_task: int) -> list:
    """As many held-out scenes as ``examples``, task for task, none of them (the evaluation world drawn with
    ``per_task`` scenes a task: its scenes differ from the smaller draw's but for a few, which are left out)."""
    seen = {(e.image_sha, e.prompt) for e in examples}
    pool = {task: [e for e in group if (e.image_sha, e.prompt) not in seen]
            for task, group in eval_examples(per_task).items()}
    if any(sum(e.task == task for e in examples) > len(group) for task, group in pool.items()):
        raise SystemExit(f"--heldout: fewer than {len(examples)} other scenes in a draw of {per_task} a task")
    return [pool[e.task].pop(0) for e in examples]


def in_turns(methods: dict, inputs: list, repeats: int) -> dict[str, tuple[float, list, list[float]]]:
    """``{name: (median seconds per pass, outputs, every pass's seconds)}``: one warm-up pass, then ``repeats``
    passes; in a pass every prompt batch is generated by each method in turn (the order rotating by prompt), so
    the machine's drift is shared by every method; a method's pass time is its sum over the prompt batches."""
    names = list(methods)
    outputs = {n: [methods[n](x) for x in inputs] for n in names}  # warm-up (and the outputs compared)
    times = {n: [] for n in names}
    for r in range(repeats):
        spent = dict.fromkeys(names, 0.0)
        for i, x in enumerate(inputs):
            shift = (r * len(inputs) + i) % len(names)
            for n in names[shift:] + names[:shift]:
                start = time.perf_counter()
                methods[n](x)
                spent[n] += time.perf_counter() - start
        for n in names:
            times[n].append(spent[n])
    return {n: (statistics.median(times[n]), outputs[n], times[n]) for n in names}


if __name__ == "__main__":
    main()
