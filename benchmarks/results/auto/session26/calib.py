"""Fresh cost tables calibrated `tables` times in a warm process (the world, one draft, batch `batch`), against the
same shapes' rounds in steady runs (one shape a call) and in runs of 4 (the calibration's shapes 4 rounds each,
the first of each run left out), interleaved."""
import statistics as st
import sys

import hf_specmm
from hf_specmm.auto import COSTS
from hf_specmm.auto import budget as budget_mod
from hf_specmm.trees import TreeShape
from world32 import world_calls  # beside this script (its folder is sys.path[0])

name, batch, tables = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
phases: list = []
_close = budget_mod.AutoBudget._close


def close(self, now, timed):
    e = self.open
    if e is not None:
        drafted = e["drafted"] or e["start"]
        prev = self.log[-1]["shape"] if self.log else None
        phases.append((e["shape"].label, e["rows"], drafted - e["start"], now - drafted, prev))
    return _close(self, now, timed)


budget_mod.AutoBudget._close = close
world, target, inputs, gen = world_calls(batch)
draft = world.drafts[name]
CAL = [0, 2, 8, TreeShape(2, 4, 8), TreeShape(4, 6, 32), TreeShape(8, 6, 64)]
RUNS = [s for s in CAL for _ in range(4)]
POINTS = [("verify", "chain", 1, "plain"), ("verify", "chain", 3, "chain 2"), ("verify", "chain", 9, "chain 8"),
          ("draft", "chain:2", None, "chain 2"), ("draft", "chain:8", None, "chain 8"),
          ("verify", "tree", 9, "tree 2,4,8"), ("verify", "tree", 33, "tree 4,6,32"),
          ("verify", "tree", 65, "tree 8,6,64"),
          ("draft", "tree:2,4", None, "tree 2,4,8"), ("draft", "tree:4,6", None, "tree 4,6,32"),
          ("draft", "tree:8,6", None, "tree 8,6,64")]
cal: dict = {p: [] for p in POINTS}
steady: dict = {p: [] for p in POINTS}
runs: dict = {p: [] for p in POINTS}


def collect(into, in_runs=False):
    for p in POINTS:
        part, _, _, label = p
        sel = [(a, b) for lab, r, a, b, prev in phases if lab == label and r > batch // 2 and
               (not in_runs or prev == label)]
        if sel:
            into[p].append(st.median(a if part == "draft" else b for a, b in sel))


for x in inputs:  # warm-up
    target.generate(**x, **gen, assistant_model=hf_specmm.Auto(draft, shapes=CAL))
for t in range(tables):
    COSTS.clear()
    auto = hf_specmm.Auto(draft, max_tokens=64)
    for x in inputs:
        target.generate(**x, **gen, assistant_model=auto)
    table = COSTS.tables[[k for k in COSTS.tables if f"batch<={batch} |" in k][0]]
    for p in POINTS:
        part, a, w, _ = p
        v = table.verify[a].get(w, []) if part == "verify" else table.draft.get(a, [])
        cal[p].append(st.median(v) if v else float("nan"))
    for g in CAL:
        del phases[:]
        for x in inputs:
            target.generate(**x, **gen, assistant_model=hf_specmm.Auto(draft, shapes=[g]))
        collect(steady)
    del phases[:]
    for i, x in enumerate(inputs * 2):  # each call starts its runs at another shape (a call's policy starts anew)
        k = 4 * (i % len(CAL))
        target.generate(**x, **gen, assistant_model=hf_specmm.Auto(draft, shapes=RUNS[k:] + RUNS[:k]))
    collect(runs, in_runs=True)
print("point | calibration (median of tables) | steady | runs of 4 | calibration / steady | runs / steady")
for p in POINTS:
    c, s, r = (st.median(v) if v else float("nan") for v in (cal[p], steady[p], runs[p]))
    print(f"{p[0]} {p[1]} {p[2] or ''} | {c * 1e3:.2f} | {s * 1e3:.2f} | {r * 1e3:.2f} | {c / s:.3f} | {r / s:.3f}")
