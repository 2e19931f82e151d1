"""Where hf_specmm.Auto's rounds spend their time on a bench preset, next to the same shapes run fixed.

On an H200 (benchmarks/results/gpu-h200/) Auto's cost table put every drafted
round 50 ms or more above what the same shapes took in fixed calls, and Auto ran plain generate where fixed
chains and trees ran 1.8-2.8x plain. This times, in turns on one preset's inputs (controlled acceptance from
the world's text-only profile), each of: plain generate, a fixed chain of 5, Auto with fixed shapes (its hooks,
one shape: ``[5]``; plain steps between: ``[0, 5]``; a chain and a tree in turn: ``[5, tree 4,6,32]``) and Auto
choosing, so the per-round cost of Auto's hooks, of plain steps between drafted rounds and of a changing shape
are told apart; then Auto's cost table (medians per verification width and drafted shape), its realised shares
and its ranking. ``--slow-calibration 0.3`` emulates the H200's calibration on any machine.

    python benchmarks/auto_diag.py --preset llava-1.5-7b-shape --device cuda --dtype bfloat16 --draft-kind feature_head
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any, Iterator

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def slow_calibration(seconds: float) -> Iterator[None]:
    """Every drafted calibration round of a choosing Auto takes ``seconds`` longer in each of its two phases
    (drafting, verification): the H200's calibration, which timed drafted rounds 3-7x what the same shapes took
    in fixed calls (benchmarks/results/gpu-h200/), emulated on any machine."""
    from hf_specmm.auto.budget import AutoBudget
    from hf_specmm.auto.policy import FixedPolicy

    drafted, observe = AutoBudget.drafted, AutoBudget.observe

    def calibrating(budget: AutoBudget) -> bool:
        round_ = budget.open
        return round_ is not None and not isinstance(budget.policy, FixedPolicy) and bool(round_["shape"].gamma) \
            and round_["choice"].predicted_tokens_per_s is None and round_["choice"].curve_seconds == 0.0

    def slow_drafted(budget: AutoBudget) -> None:
        if calibrating(budget):
            time.sleep(seconds)
        drafted(budget)

    def slow_observe(budget: AutoBudget, *args: Any, **kwargs: Any) -> None:
        if calibrating(budget):
            time.sleep(seconds)
        observe(budget, *args, **kwargs)

    AutoBudget.drafted, AutoBudget.observe = slow_drafted, slow_observe
    try:
        yield
    finally:
        AutoBudget.drafted, AutoBudget.observe = drafted, observe


def _per_round(method: Any, seconds: float) -> str:
    rounds = len(method.stats[-1].tokens_per_round)
    return f"{rounds} rounds, {1e3 * seconds / max(rounds, 1):.1f} ms per round (prefill included)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--draft-kind", default="feature_head")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--auto-calls", type=int, default=4, help="Auto (choosing) calls before the turns")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--profile",
                        default="benchmarks/results/world-acceptance-profiles/world_profile_text-only-distilled.json")
    parser.add_argument("--slow-calibration", type=float, default=0.0, metavar="SECONDS",
                        help="add this to each phase of Auto's drafted calibration rounds (emulates the H200's)")
    args = parser.parse_args(argv)
    with slow_calibration(args.slow_calibration) if args.slow_calibration else contextlib.nullcontext():
        return _diagnose(args)


def _diagnose(args: argparse.Namespace) -> int:
    from hf_specmm.auto import Auto
    from hf_specmm.auto.acceptance import read_profile
    from hf_specmm.auto.store import COSTS
    from hf_specmm.auto.policy import cost_aware_policy
    from hf_specmm.bench.config import BenchConfig
    from hf_specmm.bench.methods import OursMethod, PlainMethod
    from hf_specmm.bench.presets import build_preset
    from hf_specmm.bench.runner import BenchmarkRun, BenchStep
    from hf_specmm.trees import TreeShape

    kind = args.draft_kind
    config = BenchConfig(preset=args.preset, device=args.device, dtype=args.dtype, draft_kinds=[kind], gammas=[5],
                         batch_sizes=[args.batch], max_new_tokens=args.max_new_tokens,
                         acceptance_profile=read_profile(args.profile), auto=True, stock=False)
    start = time.perf_counter()
    run = BenchmarkRun(config, build_preset(args.preset, args.device, args.dtype, config.seed))
    step = BenchStep(run, args.batch, 5, trees=[], auto=True)
    print(f"built in {time.perf_counter() - start:.1f} s", flush=True)

    def fixed_auto(shapes: list) -> OursMethod:
        method = OursMethod(step, kind)
        method.auto = Auto(step.proposers[kind], shapes=shapes)
        return method

    methods = {"plain": PlainMethod(step), "chain 5": step.ours[kind], "Auto [5]": fixed_auto([5]),
               "Auto [0, 5]": fixed_auto([0, 5]), "Auto [5, tree 4,6,32]": fixed_auto([5, TreeShape(4, 6, 32)]),
               "Auto": step.ours_auto[f"{kind}_auto"]}

    def timed(method: Any) -> float:
        _sync(args.device)
        t0 = time.perf_counter()
        method()
        _sync(args.device)
        return time.perf_counter() - t0

    auto = methods["Auto"]
    for name, method in methods.items():  # warm-up; Auto's first calls calibrate and learn
        timed(method)
    for i in range(args.auto_calls):
        seconds = timed(auto)
        report = auto.stats[-1].auto
        shapes = {k: (v["rounds"], round(v["seconds"], 3)) for k, v in report["per_shape"].items()}
        print(f"Auto call {i}: {seconds:.3f} s, calibration rounds {report['calibration_rounds']}: {shapes}", flush=True)
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.turns):
        for name, method in methods.items():
            times[name].append(timed(method))
    for name, method in methods.items():
        median = statistics.median(times[name])
        rounds = _per_round(method, median) if getattr(method, "stats", None) else ""
        print(f"{name:24s} median {median:.3f} s  {rounds}", flush=True)

    report = auto.stats[-1].auto
    costs = COSTS.tables[report["cost_key"]]
    ms = lambda v: round(1e3 * statistics.median(v), 2) if v else None  # noqa: E731
    print("verification ms by width:", {k: {w: ms(v) for w, v in sorted(ws.items())} for k, ws in costs.verify.items()})
    print("drafting ms by shape:", {k: ms(v) for k, v in costs.draft.items()})
    print("plain generate step ms:", ms(costs.stock), "| speed", round(costs.speed, 3),
          "| kind factors", {k: round(costs.relative_factor(k), 3) for k in ("chain", "tree")})
    acceptance = auto.auto.acceptance(step.target)
    print("realised shares:", {f: round(acceptance.yield_of(f), 3) for f in ("chain", "tree 2", "tree 4", "tree 8")})
    for choice in cost_aware_policy(auto.auto.max_tokens, auto.auto.max_depth, True, True).rank(acceptance, costs, 1)[:8]:
        print(f"  {choice.shape.label:16s} {choice.predicted_tokens_per_s:9.1f} tok/s predicted, "
              f"{choice.expected_tokens:.2f} tokens / {1e3 * choice.curve_seconds:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
