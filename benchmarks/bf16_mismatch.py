"""How often greedy speculative output differs from plain greedy ``generate``, per precision.

Speculative decoding verifies γ+1 tokens in one target forward; plain decoding computes one token per
forward. In float32 both round alike to far below any logit gap, and hf_specmm's output is token-for-token
plain's (the test suite checks it). In bf16/fp16 the two kernels round a near-tie differently now and then,
and from there the rows differ. This script counts the share of rows that differ, for hf_specmm's
speculative generate and for stock transformers assisted generation (batch 1, where stock runs), on the
same inputs, against plain ``generate`` in the same dtype:

- ``world``: the shipped world target and its distilled drafts (``hf_specmm/world/checkpoints``), held-out
  scenes of the three tasks, each model cast to the dtype;
- ``fixture:<family>``: the tiny random test targets, with the target's exact text copy (stock runs it
  too) and an exact feature head (the target itself drafting: every token accepted);
- ``preset:<name>``: a bench preset under the margin rule (``hf_specmm.bench.margins``), its controlled
  acceptance draft.

Run from the repository root (CPU; bf16 and fp16 matmuls run there too)::

    python benchmarks/bf16_mismatch.py --out benchmarks/results/bf16-mismatch
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

import hf_specmm
from hf_specmm.bench.margins import summarize_margins

GAMMA = 5


def plain(target: Any, inputs: dict, max_new_tokens: int, logits: list | None = None) -> torch.Tensor:
    """Plain greedy ``generate``; ``logits``: gets each step's logits appended (batch 1: no finished rows)."""
    hf_specmm.disable(target)
    out = target.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, output_logits=True,
                          return_dict_in_generate=True)
    if logits is not None:
        logits.extend(out.logits)
    return out.sequences


def ours(target: Any, inputs: dict, max_new_tokens: int, draft: Any) -> torch.Tensor:
    hf_specmm.enable(target)
    try:
        return target.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, assistant_model=draft,
                               num_assistant_tokens=GAMMA, num_assistant_tokens_schedule="constant")
    finally:
        hf_specmm.disable(target)


def stock(target: Any, inputs: dict, max_new_tokens: int, draft: Any) -> torch.Tensor:
    """Stock assisted generation drafting γ = GAMMA tokens every round, as ours does: stock reads γ, its schedule
    and its confidence threshold (0.4 by default: it stops drafting below it) from the draft's generation config."""
    hf_specmm.disable(target)
    config = draft.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = [getattr(config, name) for name in names]
    for name, value in zip(names, (GAMMA, "constant", 0.0)):
        setattr(config, name, value)
    try:
        return target.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, assistant_model=draft)
    finally:
        for name, value in zip(names, saved):
            setattr(config, name, value)


def _cast(inputs: dict, model: Any) -> dict:
    dtype, device = next(model.parameters()).dtype, model.device
    return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in inputs.items()}


def compare(target: Any, chunks: list[list[Any]], encode: Callable[[list[Any]], dict], drafts: dict[str, Any],
            stock_drafts: set[str], max_new_tokens: int) -> dict[str, Any]:
    """Rows whose output differs from plain's (same dtype, same batch), per method: each chunk as one
    left-padded batch (ours only: stock refuses batch > 1) and each of its items alone (ours, stock)."""
    counts: dict[str, list[int]] = {}
    errors: dict[str, str] = {}
    step_logits: list[torch.Tensor] = []  # plain's logits at batch 1: the margins behind the mismatches

    def tally(name: str, out: torch.Tensor, reference: torch.Tensor) -> None:
        entry = counts.setdefault(name, [0, 0])
        for i in range(out.shape[0]):
            entry[0] += int(not torch.equal(out[i], reference[i]))
            entry[1] += 1

    for chunk in chunks:
        batch = _cast(encode(chunk), target)
        reference = plain(target, batch, max_new_tokens)
        for name, draft in drafts.items():
            tally(f"ours batch {len(chunk)}: {name}", ours(target, batch, max_new_tokens, draft), reference)
        for item in chunk:
            row = _cast(encode([item]), target)
            one = plain(target, row, max_new_tokens, step_logits)
            for name, draft in drafts.items():
                tally(f"ours batch 1: {name}", ours(target, row, max_new_tokens, draft), one)
                if name in stock_drafts and name not in errors:
                    try:
                        tally(f"stock batch 1: {name}", stock(target, row, max_new_tokens, draft), one)
                    except Exception as exc:  # stock's own refusal (a family it cannot assist): reported, not hidden
                        errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return {"differing_rows": {k: {"differ": d, "rows": n, "share": d / n} for k, (d, n) in counts.items()},
            "stock_errors": errors, "plain_margins": summarize_margins(step_logits)}


def world_case(dtype: torch.dtype, per_task: int, batch: int = 8) -> dict[str, Any]:
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from hf_specmm.hub import load_draft
    from hf_specmm.train.data import encode_prompts
    from hf_specmm.world.shipped import CHECKPOINTS, eval_examples
    from hf_specmm.world.target import MAX_ANSWER_TOKENS

    # the checkpoints themselves (not load_world_models: it also wants drafts shipped later than these three)
    target = LlavaForConditionalGeneration.from_pretrained(CHECKPOINTS / "world-target", dtype=dtype).eval()
    processor = AutoProcessor.from_pretrained(CHECKPOINTS / "world-target")
    drafts = {f"{kind} (distilled)": load_draft(CHECKPOINTS / f"{kind}-draft").to(dtype).eval()
              for kind in ("text-only", "image-adapter", "feature-head")}
    examples = [e for task in eval_examples(per_task).values() for e in task]
    chunks = [examples[i:i + batch] for i in range(0, len(examples), batch)]
    return compare(target, chunks, lambda items: encode_prompts(processor, items, "raw", "cpu"), drafts,
                   {"text-only (distilled)"}, MAX_ANSWER_TOKENS)


def fixture_case(family: str, dtype: torch.dtype, rows: int, max_new_tokens: int, batch: int = 8) -> dict[str, Any]:
    from hf_specmm import testing
    from hf_specmm.testing.drafts import feature_head_from_target, text_draft_from_target

    target = testing.tiny_target(family)
    processor = testing.tiny_processor(family)
    drafts = {"exact text copy": text_draft_from_target(target), "exact feature head": feature_head_from_target(target)}
    target = target.to(dtype)
    drafts = {k: d.to(dtype) for k, d in drafts.items()}
    gen = torch.Generator().manual_seed(0)
    words = testing.shaping.WORDS[:40]
    items = [(" ".join(words[j] for j in torch.randint(0, len(words), (4 + i % 7,), generator=gen)),
              testing.tiny_image(i)) for i in range(rows)]
    chunks = [items[i:i + batch] for i in range(0, rows, batch)]

    def encode(chunk: list[tuple[str, Any]]) -> dict:
        return dict(testing.make_inputs(family, processor, [p for p, _ in chunk], [im for _, im in chunk]))

    return compare(target, chunks, encode, drafts, {"exact text copy"}, max_new_tokens)


def to_markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| case | dtype | method: draft | rows differing from plain | share |", "|---|---|---|---|---|"]
    for key, r in results.items():
        case, dtype = key.rsplit(" ", 1)
        for method, v in sorted(r["differing_rows"].items()):
            lines.append(f"| {case} | {dtype} | {method} | {v['differ']} / {v['rows']} | {100 * v['share']:.1f} % |")
        for name, err in r["stock_errors"].items():
            lines.append(f"| {case} | {dtype} | stock batch 1: {name} | n/a ({err}) | |")
    lines += ["", "Plain greedy margins behind them (batch 1, every generated step): top-1 minus top-2 logit in bf16 "
              "spacings at the top-1 logit", "", "| case | dtype | steps | min | median | steps under 4 spacings |",
              "|---|---|---|---|---|---|"]
    for key, r in results.items():
        m = r["plain_margins"]
        lines.append(f"| {key.rsplit(' ', 1)[0]} | {key.rsplit(' ', 1)[1]} | {m['steps']} | {m['min_margin_ulps']:.3g} | "
                     f"{m['median_margin_ulps']:.3g} | {100 * m['share_below_4_ulps']:.1f} % |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16", "float32"])
    parser.add_argument("--families", nargs="+", default=["llava", "qwen2_5_vl", "gemma3", "idefics3"])
    parser.add_argument("--per-task", type=int, default=16, help="world: held-out scenes per task")
    parser.add_argument("--rows", type=int, default=24, help="fixtures: prompts per family (multiple of 8)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="fixtures: new tokens per row")
    parser.add_argument("--skip-world", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bf16-mismatch"))
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for name in args.dtypes:
        dtype = getattr(torch, name)
        if not args.skip_world:
            results[f"world {name}"] = world_case(dtype, args.per_task)
            print(to_markdown({f"world {name}": results[f"world {name}"]}), flush=True)
        for family in args.families:
            key = f"fixture:{family} {name}"
            results[key] = fixture_case(family, dtype, args.rows, args.max_new_tokens)
            print(to_markdown({key: results[key]}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bf16_mismatch.py " + " ".join(argv)
    meta = {"command": command, "torch": torch.__version__, "gamma": GAMMA,
            "transformers": __import__("transformers").__version__, "threads": torch.get_num_threads()}
    (args.out / "mismatch.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (args.out / "mismatch.md").write_text(f"`{command}` (torch {meta['torch']}, transformers {meta['transformers']}, "
                                          f"CPU, γ = {GAMMA}, greedy)\n\n" + to_markdown(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
