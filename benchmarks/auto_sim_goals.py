"""Auto's goals on the simulator (docs/auto.md): every profile in benchmarks/profiles at batch 1 and 8, 5 seeds,
400 calls with the first 50 left out (steady), the first 20 calls of a fresh process (fresh), and three drifts
at call 200 (the machine 2x slower, the draft 3x slower, the acceptance to 0) measured over calls 250-400.

    python benchmarks/auto_sim_goals.py --out goals.json [--profiles NAME ...] [--batches 1 8] [--seeds 5]
                                        [--drift-seeds 1] [--jobs 2]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the results JSON written")
    parser.add_argument("--profiles", nargs="+", default=sorted(p.stem for p in PROFILES.glob("*.json")),
                        help="profile names (default: every one shipped)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per profile and batch")
    parser.add_argument("--drift-seeds", type=int, default=1, help="seeds per drift (batch 1)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--calls", type=int, default=400,
                        help="simulated calls per run (the goals: 400; at least 51, and 251 with drifts)")
    args = parser.parse_args(argv)
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
