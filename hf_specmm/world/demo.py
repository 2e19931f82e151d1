"""``hf-specmm demo``: the shipped world target answering held-out scenes, plain vs speculative.

For each task (caption, vqa, reasoning) one batch of held-out scenes is answered by plain greedy
``generate`` and by ``generate(assistant_model=draft)`` with each shipped draft; the outputs must be
identical token for token (the demo stops with an error otherwise). It prints one scene's answers per
task, then τ (tokens per target forward), acceptance and the measured speedup per draft kind and task,
and writes ``results.json``, ``results.md`` and ``tau.png`` into ``--output-dir``.

    hf-specmm demo                       # ~1 minute on 2 CPU cores, nothing downloaded or trained
    hf-specmm demo --per-task 16 --gamma 3 --output-dir demo-out
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

import torch

from .. import api
from ..bench.timing import interleaved_medians
from ..train.data import encode_prompts
from .shipped import CHECKPOINTS, DRAFT_NAMES, eval_examples, load_world_models
from .target import MAX_ANSWER_TOKENS


def _check_plot_dependency(plot: bool) -> None:
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("hf-specmm demo writes a PNG plot with matplotlib: pip install 'hf-specmm[bench]' "
                         "(or pass --no-plot)")


@torch.no_grad()
def run_demo(output_dir: str | Path, per_task: int = 8, gamma: int = 5, repeats: int = 3, warmup: int = 1,
             ship_dir: str | Path = CHECKPOINTS, plot: bool = True, echo: Any = print) -> dict[str, Any]:
    """Run the demo; returns ``{"rows": [...], "examples": [...]}`` (also written as results.json).

    Raises ``AssertionError`` if a speculative output differs from the plain one (never expected).
    """
    if per_task < 1 or gamma < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need per_task, gamma, repeats >= 1 and warmup >= 0; got {per_task}, {gamma}, "
                         f"{repeats}, {warmup}")
    _check_plot_dependency(plot)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    world = load_world_models(ship_dir)
    target, processor = world.target, world.processor
    drafts = {name: d for name, d in world.drafts.items() if DRAFT_NAMES[name] is not None}  # the shipped ones
    api.enable(target)
    rows, shown = [], []
    echo(f"target: world-target ({sum(p.numel() for p in target.parameters()):,} parameters); drafts: "
         + ", ".join(f"{n} ({sum(p.numel() for p in d.parameters()):,})" for n, d in drafts.items())
         + f"; γ={gamma}; {per_task} held-out scenes per task, batched")
    for task, examples in eval_examples(per_task, out).items():
        inputs = encode_prompts(processor, examples, "raw", target.device)
        runs = {"plain": lambda: target.generate(**inputs, max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False)}
        for name, draft in drafts.items():
            runs[name] = lambda d=draft: (target.generate(**inputs, max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False,
                                                          assistant_model=d, num_assistant_tokens=gamma,
                                                          num_assistant_tokens_schedule="constant"),
                                          api.last_stats(target))
        timed = interleaved_medians(runs, target.device, warmup, repeats)
        plain_s, plain, _ = timed["plain"]
        prompt_len = inputs["input_ids"].shape[1]
        answers = {}
        for name in drafts:
            seconds, (spec, stats), _ = timed[name]
            assert torch.equal(spec, plain), f"{name}: speculative output differs from plain generate on {task}"
            answers[name] = processor.decode(spec[0, prompt_len:], skip_special_tokens=True)
            rows.append({"task": task, "draft": name, "tau": round(stats.block_efficiency, 3),
                         "acceptance": round(stats.acceptance_rate, 3), "speedup": round(plain_s / seconds, 3),
                         "identical": True, "plain_s": round(plain_s, 4), "speculative_s": round(seconds, 4),
                         "new_tokens": stats.generated_tokens})
        example = {"task": task, "image": str(examples[0].image), "prompt": examples[0].prompt,
                   "reference": examples[0].response,
                   "plain": processor.decode(plain[0, prompt_len:], skip_special_tokens=True), "speculative": answers}
        shown.append(example)
        echo(f"\n[{task}] {example['image']}\n  Q: {example['prompt']}\n  plain      : {example['plain']}")
        for name, text in answers.items():
            echo(f"  {name:<26}: {text}  (identical: {text == example['plain']})")
    table = _markdown(rows, gamma)
    echo("\n" + table)
    result = {"gamma": gamma, "per_task": per_task, "repeats": repeats, "rows": rows, "examples": shown}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(table + "\n")
    if plot:
        _plot(rows, out / "tau.png", gamma)
    echo(f"\nwrote {out / 'results.json'}, {out / 'results.md'}" + (f", {out / 'tau.png'}" if plot else ""))
    return result


def _markdown(rows: list[dict[str, Any]], gamma: int) -> str:
    lines = [f"| task | draft | τ (γ={gamma}) | acceptance | speedup vs plain | outputs identical |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['task']} | {r['draft']} | {r['tau']:.2f} | {r['acceptance']:.2f} | {r['speedup']:.2f}× | "
              f"{'yes' if r['identical'] else 'NO'} |" for r in rows]
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], path: Path, gamma: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    drafts = list(dict.fromkeys(r["draft"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / len(drafts)
    for k, draft in enumerate(drafts):
        for ax, key in zip(axes, ("tau", "speedup")):
            values = [next(r[key] for r in rows if r["task"] == t and r["draft"] == draft) for t in tasks]
            ax.bar([i + k * width for i in range(len(tasks))], values, width, label=draft)
    for ax, title in zip(axes, (f"τ: tokens per target forward (γ={gamma})", "measured speedup vs plain (this CPU)")):
        ax.set_xticks([i + width * (len(drafts) - 1) / 2 for i in range(len(tasks))], tasks)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default="hf_specmm_demo", help="where results.json/.md and tau.png go")
    parser.add_argument("--per-task", type=int, default=8, help="held-out scenes per task (one batch each)")
    parser.add_argument("--gamma", type=int, default=5, help="draft tokens per round")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per method (median reported)")
    parser.add_argument("--no-plot", dest="plot", action="store_false", help="skip tau.png (no matplotlib needed)")
    parser.add_argument("--checkpoints", default=str(CHECKPOINTS), help="folder with the world checkpoints")


def run(args: argparse.Namespace) -> int:
    run_demo(args.output_dir, per_task=args.per_task, gamma=args.gamma, repeats=args.repeats,
             ship_dir=args.checkpoints, plot=args.plot)
    return 0
