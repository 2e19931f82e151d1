"""The shipped world at batch 1, one draft under Auto: per prompt, plain generate and an Auto call in turns (3 passes
after 64 warm-up Auto calls); the true ratio over the calls Auto ran speculative (plain's time over Auto's, same
prompts) against Auto's predicted share, and what each term of a pair (CostTable.pair_share) makes of it. argv: draft"""
import sys, time, statistics as st
import torch, hf_specmm
from hf_specmm.auto.store import COSTS
from world_batch1 import world_batch1
torch.set_num_threads(2)
name = sys.argv[1]
world, target, x1, gen = world_batch1()
auto = hf_specmm.Auto(world.drafts[name], max_tokens=64)
for c in range(64):
    target.generate(**x1[c % 32], **gen, assistant_model=auto)
rows = []
for p in range(3):
    for i in range(32):
        s = time.perf_counter(); out = target.generate(**x1[i], **gen); tp = time.perf_counter() - s
        s = time.perf_counter(); target.generate(**x1[i], **gen, assistant_model=auto); ta = time.perf_counter() - s
        a = hf_specmm.last_stats(target)
        n = out.shape[1] - x1[i]["input_ids"].shape[1]
        rows.append((i, n, tp, ta, a.auto["shapes"] == ["plain generate"], a.auto["whole_call"]))
spec = [r for r in rows if not r[4]]
print(f"calls run speculative {len(spec)} of {len(rows)}; true ratio over them (plain / Auto): "
      f"{sum(r[2] for r in spec) / sum(r[3] for r in spec):.3f}; over all: {sum(r[2] for r in rows) / sum(r[3] for r in rows):.3f}")
shares = [r[5]["share"] for r in rows if r[5] and r[5]["share"] is not None]
print(f"Auto's share: median {st.median(shares):.3f} min {min(shares):.3f} max {max(shares):.3f}")
key = next(k for k in COSTS.tables if "batch<=1 " in k)
t = COSTS.tables[key]
print("pairs (plain overhead ms, step ms, spec overhead ms, rate tok/s, round ms) and their shares:")
for pr in t.pairs:
    print("  ", [round(v * 1e3, 2) if j != 3 else round(v, 1) for j, v in enumerate(pr)], round(t.pair_share(pr), 3))
print("recent rates", [round(v) for v in t.rates], "overheads ms", [round(1e3 * v, 1) for v in t.overheads])
print("lengths", sorted(int(v) for v in t.lengths))
# the truth per term, from this run's own calls: plain generate's overhead and step by least squares over its calls
import numpy as np
n = np.array([r[1] for r in rows], float); tp = np.array([r[2] for r in rows])
A = np.stack([np.ones_like(n), n], 1); (o, s_), *_ = np.linalg.lstsq(A, tp, rcond=None)
print(f"plain generate fitted: overhead {1e3*o:.2f} ms, step {1e3*s_:.3f} ms")
ns = np.array([r[1] for r in spec], float); ts = np.array([r[3] for r in spec])
A = np.stack([np.ones_like(ns), ns], 1); (o2, s2), *_ = np.linalg.lstsq(A, ts, rcond=None)
print(f"Auto's speculative calls fitted: overhead {1e3*o2:.2f} ms, per token {1e3*s2:.3f} ms (rate {1/s2:.0f} tok/s)")
