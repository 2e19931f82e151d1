"""Auto's goals on the simulator (docs/auto.md): every profile in benchmarks/profiles at batch 1 and 8, 5 seeds,
400 calls with the first 50 left out (steady), the first 20 calls of a fresh process (fresh), and three drifts
at call 200 (the machine 2x slower, the draft 3x slower, the acceptance to 0) measured over calls 250-400.

    python benchmarks/auto_sim_goals.py --out goals.json [--profiles NAME ...] [--batches 1 8] [--seeds 5]
                                        [--drift-seeds 1] [--jobs 2]
    python benchmarks/auto_sim_goals.py --table goals.json     # the markdown tables of a results file

A row may carry an earlier Auto's figures on the same simulator and seed under its commit's key (``{"auto_over_best",
"auto_over_plain", "first_20"}``); the tables show them beside.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from hf_specmm.auto import simulate

PROFILES = Path(__file__).resolve().parent / "profiles"
DRIFTS = {"machine 2x": {"drift": [[200, 2.0]]}, "draft 3x": {"draft_drift": [[200, 3.0]]},
          "acceptance 0": {"acceptance_drift": [[200, 0.0]]}}


def one(job: tuple[str, int, int, str | None, int]) -> dict:
    name, batch, seed, drift, calls = job
    profile = json.loads((PROFILES / f"{name}.json").read_text())
    profile.update(DRIFTS.get(drift, {}))
    r = simulate(profile, calls=calls, batch=batch, seed=seed, skip=250 if drift else 50)
    keep = ("auto_over_best", "auto_over_plain", "best_shape", "auto_tokens_per_s", "best_tokens_per_s")
    return {"profile": name, "batch": batch, "seed": seed, "drift": drift, **{k: r[k] for k in keep},
            "plain_tokens_per_s": r["fixed"]["plain"], "first_20": None if drift else r["first_20"]}


STEADY, FIRST, DRIFT = (0.95, 0.98), (0.85, 0.95), 0.95


def _earlier(rows: list[dict]) -> list[str]:
    """The commits whose Auto a results file carries beside (keys of 7+ hex digits), in file order."""
    return list(dict.fromkeys(k for r in rows for k in r if len(k) >= 7 and all(c in "0123456789abcdef" for c in k)))


def table(rows: list[dict]) -> str:
    """Markdown: the steady and first-20 goals per (profile, batch), the drifts per (profile, drift), and the
    counts of rows that meet them; min and median over the seeds."""
    med, earlier = statistics.median, _earlier(rows)
    head = ["profile", "batch", "best fixed (×plain, median)", "Auto / best: min (median)", "Auto / plain: min",
            "first 20: Auto / best, / plain (min)", "goals met"]
    head += [f"Auto of {c}: / best min, first 20 / best min (seeds)" for c in earlier]
    out, met = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)], [0, 0, 0]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["profile"], r["batch"], r["drift"] or ""), []).append(r)
    steady = [(k, v) for k, v in sorted(groups.items()) if not k[2]]
    for (name, batch, _), rs in steady:
        shapes = sorted({r["best_shape"] for r in rs})
        ok = [min(r["auto_over_best"] for r in rs) >= STEADY[0] and min(r["auto_over_plain"] for r in rs) >= STEADY[1],
              min(r["first_20"]["auto_over_best"] for r in rs) >= FIRST[0]
              and min(r["first_20"]["auto_over_plain"] for r in rs) >= FIRST[1]]
        met[0], met[1] = met[0] + ok[0], met[1] + ok[1]
        best = med(r["best_tokens_per_s"] / r["plain_tokens_per_s"] for r in rs)
        cells = [name, str(batch), f"{'/'.join(shapes)} ({best:.2f})",
                 f"{min(r['auto_over_best'] for r in rs):.3f} ({med(r['auto_over_best'] for r in rs):.3f})",
                 f"{min(r['auto_over_plain'] for r in rs):.3f}",
                 f"{min(r['first_20']['auto_over_best'] for r in rs):.3f}, "
                 f"{min(r['first_20']['auto_over_plain'] for r in rs):.3f}",
                 ", ".join(w for w, k in zip(("steady", "first 20"), ok) if k) or "neither"]
        for c in earlier:
            es = [r[c] for r in rs if c in r]
            cells.append(f"{min(e['auto_over_best'] for e in es):.3f}, "
                         f"{min(e['first_20']['auto_over_best'] for e in es):.3f} ({len(es)})" if es else "—")
        out.append("| " + " | ".join(cells) + " |")
    head = ["profile", "drift at call 200", "new best (×plain)", "Auto / new best, calls 251-400", "Auto / plain",
            "within 5 %"] + [f"Auto of {c} / new best" for c in earlier]
    out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    drifts = [(k, v) for k, v in sorted(groups.items()) if k[2]]
    for (name, _, drift), rs in drifts:
        low = min(r["auto_over_best"] for r in rs)
        met[2] += low >= DRIFT
        cells = [name, drift, f"{rs[0]['best_shape']} ({rs[0]['best_tokens_per_s'] / rs[0]['plain_tokens_per_s']:.2f})",
                 f"{low:.3f}", f"{min(r['auto_over_plain'] for r in rs):.3f}", "yes" if low >= DRIFT else "no"]
        cells += [f"{rs[0][c]['auto_over_best']:.3f}" if c in rs[0] else "—" for c in earlier]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", f"Goals met: steady {met[0]} of {len(steady)}, first 20 {met[1]} of {len(steady)}, drifts {met[2]} of "
                f"{len(drifts)}."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the results JSON written (required unless --table)")
    parser.add_argument("--table", type=Path, help="print the markdown tables of this results file; run nothing")
    parser.add_argument("--profiles", nargs="+", default=sorted(p.stem for p in PROFILES.glob("*.json")),
                        help="profile names (default: every one shipped)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per profile and batch")
    parser.add_argument("--drift-seeds", type=int, default=1, help="seeds per drift (batch 1)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--calls", type=int, default=400,
                        help="simulated calls per run (the goals: 400; at least 51, and 251 with drifts)")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table(json.loads(args.table.read_text())["rows"]))
        return 0
    if args.out is None:
        parser.error("--out is required (or --table to print a results file's tables)")
    if args.calls < (251 if args.drift_seeds else 51):
        parser.error(f"--calls {args.calls}: the steady figures leave out 50 calls and the drifts 250")
    jobs = [(n, b, s, None, args.calls) for n in args.profiles for b in args.batches for s in range(args.seeds)]
    jobs += [(n, 1, s, d, args.calls) for n in args.profiles for d in DRIFTS for s in range(args.drift_seeds)]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, jobs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    for (name, batch, drift) in sorted({(r["profile"], r["batch"], r["drift"] or "") for r in rows}):
        rs = [r for r in rows if (r["profile"], r["batch"], r["drift"] or "") == (name, batch, drift)]
        line = f"{name:36s} b{batch} {drift:13s} auto/best min {min(r['auto_over_best'] for r in rs):.3f} " \
               f"median {statistics.median(r['auto_over_best'] for r in rs):.3f}  auto/plain min " \
               f"{min(r['auto_over_plain'] for r in rs):.3f}"
        if not drift:
            line += f"  first 20: auto/best min {min(r['first_20']['auto_over_best'] for r in rs):.3f} auto/plain " \
                    f"min {min(r['first_20']['auto_over_plain'] for r in rs):.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
