"""``hf-specmm demo``: the shipped world target answering held-out scenes, plain vs speculative.

For each task (caption, vqa, reasoning) one batch of held-out scenes is answered by plain greedy
``generate`` and by ``generate(assistant_model=draft)`` with each shipped draft; the outputs must be
identical token for token (the demo stops with an error otherwise). It prints one scene's answers per
task, then τ (tokens per target forward), acceptance and "identical to plain" per draft kind and task,
and writes ``results.json``, ``results.md`` and ``tau.png`` into ``--output-dir``.

No speed is printed: this target is tiny (1.8M parameters), so its wall-clock times are dominated by
Python overhead and machine noise, and a speed figure from one run can contradict τ in the same row (an
early version printed "3.93×" next to τ 1.00). τ does not depend on the machine; wall-clock speedups are
measured by ``hf-specmm bench`` (warm-up, interleaved timed repeats, medians, step costs).

    hf-specmm demo                       # seconds on 2 CPU cores, nothing downloaded or trained
    hf-specmm demo --per-task 16 --gamma 3 --output-dir demo-out
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import api
from ..train.data import encode_prompts
from .shipped import CHECKPOINTS, DRAFT_NAMES, eval_examples, load_world_models
from .target import MAX_ANSWER_TOKENS

if TYPE_CHECKING:  # argparse is used only when the dispatcher builds the parser
    import argparse

SPEED_NOTE = ("τ = tokens per target forward (1.00 = no gain), independent of the machine. For wall-clock "
              "speed on real-size targets run `hf-specmm bench` (warm-up, interleaved repeats, medians).")


def _check_plot_dependency(plot: bool) -> None:
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("hf-specmm demo writes a PNG plot with matplotlib: pip install 'hf-specmm[bench]' "
                         "(or pass --no-plot)")


@torch.no_grad()
def run_demo(output_dir: str | Path, per_task: int = 8, gamma: int = 5, ship_dir: str | Path = CHECKPOINTS,
             plot: bool = True, echo: Any = print) -> dict[str, Any]:
    """Run the demo; returns ``{"rows": [...], "examples": [...]}`` (also written as results.json).

    Raises ``AssertionError`` if a speculative output differs from the plain one (never expected).
    """
    if per_task < 1 or gamma < 1:
        raise ValueError(f"need per_task >= 1 and gamma >= 1; got {per_task}, {gamma}")
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
        gen = dict(max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False)
        plain = target.generate(**inputs, **gen)
        prompt_len = inputs["input_ids"].shape[1]
        answers = {}
        for name, draft in drafts.items():
            spec = target.generate(**inputs, **gen, assistant_model=draft, num_assistant_tokens=gamma,
                                   num_assistant_tokens_schedule="constant")
            stats = api.last_stats(target)
            assert torch.equal(spec, plain), f"{name}: speculative output differs from plain generate on {task}"
            answers[name] = processor.decode(spec[0, prompt_len:], skip_special_tokens=True)
            acceptance = stats.acceptance_rate  # None: nothing drafted (every row ended at its first token)
            rows.append({"task": task, "draft": name, "tau": round(stats.block_efficiency, 3),
                         "acceptance": None if acceptance is None else round(acceptance, 3), "identical": True,
                         "drafted": stats.drafted_tokens, "accepted": stats.accepted_tokens,
                         "new_tokens": stats.generated_tokens, "target_forwards": stats.target_forwards})
        example = {"task": task, "image": str(examples[0].image), "prompt": examples[0].prompt,
                   "reference": examples[0].response,
                   "plain": processor.decode(plain[0, prompt_len:], skip_special_tokens=True), "speculative": answers}
        shown.append(example)
        echo(f"\n[{task}] {example['image']}\n  Q: {example['prompt']}\n  plain      : {example['plain']}")
        for name, text in answers.items():
            echo(f"  {name:<26}: {text}  (identical: {text == example['plain']})")
    table = _markdown(rows, gamma)
    echo("\n" + table + "\n\n" + SPEED_NOTE)
    result = {"gamma": gamma, "per_task": per_task, "rows": rows, "examples": shown, "note": SPEED_NOTE}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(table + "\n\n" + SPEED_NOTE + "\n")
    if plot:
        _plot(rows, out / "tau.png", gamma)
    echo(f"\nwrote {out / 'results.json'}, {out / 'results.md'}" + (f", {out / 'tau.png'}" if plot else ""))
    return result


def format_acceptance(acceptance: float | None) -> str:
    """``0.87``, or ``n/a`` where nothing was drafted (0 of 0 drafts is neither 0 % nor 100 %).

        >>> format_acceptance(0.8666), format_acceptance(None)
        ('0.87', 'n/a')
    """
    return "n/a" if acceptance is None else f"{acceptance:.2f}"


def _markdown(rows: list[dict[str, Any]], gamma: int) -> str:
    lines = [f"| task | draft | τ (γ={gamma}) | acceptance (accepted of drafted) | tokens / target forwards "
             "| outputs identical |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['task']} | {r['draft']} | {r['tau']:.2f} | {format_acceptance(r['acceptance'])} "
              f"({r['accepted']} of {r['drafted']}) | "
              f"{r['new_tokens']} / {r['target_forwards']} | {'yes' if r['identical'] else 'NO'} |" for r in rows]
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
        for ax, key in zip(axes, ("tau", "acceptance")):
            values = [next(r[key] for r in rows if r["task"] == t and r["draft"] == draft) for t in tasks]
            values = [float("nan") if v is None else v for v in values]  # n/a acceptance: no bar
            ax.bar([i + k * width for i in range(len(tasks))], values, width, label=draft)
    titles = (f"τ: tokens per target forward (γ={gamma}; 1 = plain)", "acceptance: share of draft tokens kept")
    for ax, title, line in zip(axes, titles, (1.0, None)):
        ax.set_xticks([i + width * (len(drafts) - 1) / 2 for i in range(len(tasks))], tasks)
        if line is not None:
            ax.axhline(line, color="grey", lw=0.8)
        ax.set_title(title, fontsize=10)
    axes[1].legend(fontsize=8, loc="upper center")  # vqa's one-word answers leave the middle low
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the demo flags on ``parser`` (called by ``hf_specmm.cli``)."""
    from ..cli import int_at_least, output_folder
    from .shipped import world_checkpoints

    parser.add_argument("--output-dir", type=output_folder, default="hf_specmm_demo",
                        help="where results.json/.md and tau.png go (checked writable before any work)")
    parser.add_argument("--per-task", type=int_at_least(1), default=8, help="held-out scenes per task (one batch each)")
    parser.add_argument("--gamma", type=int_at_least(1), default=5, help="draft tokens per round")
    parser.add_argument("--no-plot", dest="plot", action="store_false",
                        help="skip tau.png, no matplotlib needed (default: write it)")
    parser.add_argument("--checkpoints", type=world_checkpoints, default=str(CHECKPOINTS),
                        help="folder with the world checkpoints")


def run(args: argparse.Namespace) -> int:
    run_demo(args.output_dir, per_task=args.per_task, gamma=args.gamma, ship_dir=args.checkpoints, plot=args.plot)
    return 0
