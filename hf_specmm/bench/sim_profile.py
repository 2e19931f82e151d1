"""``hf-specmm auto-sim``: run ``Auto``'s simulator on a profile, or write a profile from a bench run's rows
(``hf-specmm bench ... --write-profile`` calls :func:`profile_from_rows` on its own rows)."""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any


def _new_tokens(row: dict[str, Any]) -> float:
    """Tokens per row and call of the run (its max_new_tokens): plain tokens per second times plain's time."""
    return round(row["plain_tok_s"] * statistics.median(row["times_s"]["plain"]) / row["batch"])


def profile_from_rows(rows: list[dict[str, Any]], kind: str, acceptance: Any, source: str,
                      cold: dict[str, float] | None = None, answer_tokens: list[int] | None = None) -> dict[str, Any]:
    """A simulator profile from a bench run's fixed-shape rows of draft kind ``kind`` (every batch size the run
    has): the target's step T1 and verification Tv by width (each row's Tv scaled to the median T1), the draft's
    step Td, each tree level from the tree rows' rounds, the round and call overheads from the rows' whole
    calls; ``acceptance`` as the profile's acceptance (None: the median of its chain rows' measured rates),
    ``answer_tokens`` its answers' lengths (None: the rows' new tokens).
    Checked as ``auto-sim`` checks a profile (ValueError naming the key)."""
    from ..auto import check_sim_profile

    mine = [r for r in rows if r.get("draft_kind") == kind and r.get("tree") != "auto" and r.get("T1_ms")]
    if not mine:
        raise ValueError(f"no fixed-shape rows of draft kind {kind!r} with timings")
    if acceptance is None:
        rates = [r["acceptance"] for r in mine if not r.get("tree") and r.get("acceptance") is not None]
        if not rates:
            raise ValueError(f"no chain rows of draft kind {kind!r} with a measured acceptance: give --acceptance")
        acceptance = round(statistics.median(rates), 4)
    by_batch: dict[int, dict[str, Any]] = {}
    for b in sorted({r["batch"] for r in mine}):
        rs = [r for r in mine if r["batch"] == b]
        chains = [r for r in rs if not r.get("tree") and r.get("Td_ms")]
        t1 = statistics.median(r["T1_ms"] for r in rs)
        verify: dict[int, list[float]] = {1: [t1]}
        for r in rs:
            width = 1 + (int(r["tree"].split(",")[2]) if r.get("tree") else r["gamma"])
            verify.setdefault(width, []).append(r["Tv_ms"] * t1 / r["T1_ms"])
        step = statistics.median(r["Td_ms"] for r in chains) if chains else 0.0
        curve = {str(w): round(statistics.median(v), 3) for w, v in sorted(verify.items())}

        def round_ms(r: dict[str, Any]) -> float:
            call_ms = 1e3 * b * _new_tokens(r) / r["ours_tok_s"]
            return (call_ms - r.get("Tp_ms", 0.0) - r.get("Tpd_ms", 0.0)) / r["rounds"]

        over = [round_ms(r) - r["Tv_ms"] * t1 / r["T1_ms"] - r["gamma"] * step for r in chains]
        overhead = max(statistics.median(over), 0.0) if over else 0.0
        levels: dict[str, list[float]] = {}
        for r in (r for r in rs if r.get("tree")):
            k, depth, _ = (int(x) for x in r["tree"].split(","))
            rest = round_ms(r) - r["Tv_ms"] * t1 / r["T1_ms"] - overhead - step
            levels.setdefault(str(k), []).append(max(rest / max(depth - 1, 1), step))
        plain = [1e3 * b * _new_tokens(r) / r["plain_tok_s"] - r.get("Tp_ms", 0.0) - (_new_tokens(r) - 1) * t1
                 for r in chains if r.get("plain_tok_s")]
        by_batch[b] = {"verify_ms": curve, "step": step, "round": overhead,
                       "level": {k: round(statistics.median(v), 3) for k, v in levels.items()},
                       "call": max(statistics.median(plain), 0.0) + statistics.median(r.get("Tp_ms", 0.0) for r in rs)}
    first = min(by_batch)
    base = by_batch[first]
    tokens = [round(_new_tokens(r)) for r in mine if not r.get("tree")] or [64]
    profile: dict[str, Any] = {
        "source": source,
        "verify_ms": base["verify_ms"],
        "draft_ms": {"first": round(base["step"], 3), "step": round(base["step"], 3), "level": base["level"]},
        "overhead_ms": {"round": round(base["round"], 3), "call": round(base["call"], 3)},
        "acceptance": acceptance,
        "answer_tokens": answer_tokens or [max(tokens), max(tokens)],
    }
    if len(by_batch) > 1 or first != 1:  # the verify curve above is batch `first`'s
        profile["batch"] = {str(b): {"verify_ms": v["verify_ms"],
                                     "draft_scale": round(v["step"] / base["step"], 3) if base["step"] else 1.0}
                            for b, v in by_batch.items() if b != 1}
    if cold:
        profile["cold"] = cold
    check_sim_profile(profile)  # what auto-sim would refuse is not written
    return profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..cli import int_at_least

    parser.add_argument("--profile", type=Path,
                        help="the profile (JSON, docs/auto.md); required unless --from-bench (default: none)")
    parser.add_argument("--calls", type=int_at_least(1), default=400, help="calls simulated")
    parser.add_argument("--batch", type=int_at_least(1), default=1, help="rows per call")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="the draws' seed")
    parser.add_argument("--skip", type=int_at_least(0), default=0, help="figures leave out the first N calls")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--from-bench", type=Path, nargs="+", metavar="BENCH_JSON",
                        help="instead: write --write-profile from the rows of --draft-kind in these bench.json files "
                             "(e.g. one run per batch size; default: off)")
    parser.add_argument("--draft-kind", help="with --from-bench: the rows' draft kind (default: none)")
    parser.add_argument("--acceptance", help="with --from-bench: the profile's acceptance (a number, or a JSON file "
                                             "as hf-specmm world-tau --profile writes); default: the chains' rate")
    parser.add_argument("--answer-tokens", type=int, nargs=2, metavar=("MIN", "MAX"),
                        help="with --from-bench: new tokens per row (default: the run's max_new_tokens)")
    parser.add_argument("--cold", type=float, nargs=2, metavar=("FACTOR", "ROUNDS"),
                        help="with --from-bench: the first ROUNDS rounds at a block width new to the process take "
                             "FACTOR x (a machine's one-time costs; default: none)")
    parser.add_argument("--write-profile", type=Path, help="with --from-bench: the profile file written (default: none)")


def _command(args: argparse.Namespace) -> str:
    """The ``--from-bench`` command that writes this profile (its ``source``; the output path left out)."""
    parts = ["--from-bench", *map(str, args.from_bench), "--draft-kind", args.draft_kind]
    if args.acceptance is not None:
        parts += ["--acceptance", args.acceptance]
    if args.answer_tokens is not None:
        parts += ["--answer-tokens", *map(str, args.answer_tokens)]
    if args.cold is not None:
        parts += ["--cold", f"{args.cold[0]:g}", f"{int(args.cold[1])}"]
    return "hf-specmm auto-sim " + " ".join(map(shlex.quote, parts))


def run(args: argparse.Namespace) -> int:
    from ..auto import simulate

    def refuse(message: str) -> int:
        print(f"hf-specmm auto-sim: error: {message}", file=sys.stderr)
        return 2

    if args.from_bench is None and any(x is not None for x in (args.draft_kind, args.acceptance, args.answer_tokens,
                                                                args.cold, args.write_profile)):
        return refuse("--draft-kind, --acceptance, --answer-tokens, --cold and --write-profile go with --from-bench")
    if args.from_bench is not None:
        if args.draft_kind is None or args.write_profile is None:
            return refuse("--from-bench needs --draft-kind and --write-profile")
        if args.cold is not None and (not args.cold[1].is_integer() or args.cold[1] < 1):
            return refuse(f"--cold FACTOR ROUNDS: ROUNDS must be an integer >= 1, got {args.cold[1]:g}")
        try:
            rows = [row for path in args.from_bench for row in json.loads(path.read_text())["rows"]]
            acceptance: Any = None  # the chain rows' median
            if args.acceptance is not None:
                path = Path(args.acceptance)
                acceptance = json.loads(path.read_text()) if path.suffix == ".json" else float(args.acceptance)
            cold = None if args.cold is None else {"factor": args.cold[0], "rounds": int(args.cold[1])}
            profile = profile_from_rows(rows, args.draft_kind, acceptance, _command(args), cold, args.answer_tokens)
        except (OSError, ValueError, KeyError, TypeError) as error:
            return refuse(f"--from-bench {' '.join(map(str, args.from_bench))}: {error}")
        try:
            args.write_profile.write_text(json.dumps(profile, indent=1) + "\n")
        except OSError as error:
            return refuse(f"--write-profile {args.write_profile}: {error.strerror or error}")
        return 0
    if args.profile is None:
        return refuse("--profile is required (or --from-bench)")
    try:
        data = json.loads(args.profile.read_text())
        result = simulate(data, calls=args.calls, batch=args.batch, seed=args.seed, skip=args.skip)
    except OSError as error:
        return refuse(f"--profile {args.profile}: {error.strerror or error}")
    except ValueError as error:
        return refuse(f"--profile {args.profile}: {error}")
    if args.json:
        print(json.dumps(result))
        return 0
    for shape, rate in sorted(result["fixed"].items(), key=lambda x: -x[1]):
        print(f"{shape:>16}  {rate:10.2f} tokens/s")
    print(f"{'Auto':>16}  {result['auto_tokens_per_s']:10.2f} tokens/s")
    taken = result["auto_shapes_by_call"]
    for start in range(0, len(taken), max(len(taken) // 8, 1)):
        part = taken[start:start + max(len(taken) // 8, 1)]
        print(f"calls {start + 1}-{start + len(part)}: mostly {max(set(part), key=part.count)}")
    print(f"auto-sim: auto/best={result['auto_over_best']:.3f} auto/plain={result['auto_over_plain']:.3f} "
          f"best={result['best_shape']}")
    return 0
