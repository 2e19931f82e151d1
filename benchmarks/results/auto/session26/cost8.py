"""The shipped world at batch 8 (32 prompts, 4 calls of 8), one draft: after `warm` passes of Auto, each chain's
predicted round time in the batch-8 cost table (its curves, and × the chains' time factor) and predicted tokens per
second, against what fixed chains realise over `passes` passes: their round times (rounds with 5-8 live rows, each
call's last round left out), the draft and verify phases of those rounds, their critical tokens per second (the
longest row's tokens over the most rounds a row of the call takes, over the mean round) and their seconds per pass.

    PYTHONPATH=. python benchmarks/results/auto/session26/cost8.py "feature-head (distilled)" 24 9
"""
import statistics as st
import sys
import time

import hf_specmm
from hf_specmm.auto import COSTS
from hf_specmm.auto import budget as budget_mod
from hf_specmm.auto.policy import cost_aware_policy
from world32 import world_calls  # beside this script (its folder is sys.path[0])

name, warm, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

# each call's closed rounds, and each round's (shape, live rows, draft phase, the rest), from the budget itself
logs: list = []
phases: list = []
_report, _close = budget_mod.AutoBudget.report, budget_mod.AutoBudget._close


def report(self):
    out = _report(self)
    logs.append(list(self.log))
    return out


def close(self, now, timed):
    e = self.open
    if e is not None:
        drafted = e["drafted"] or e["start"]
        phases.append((e["shape"].label, e["rows"], drafted - e["start"], now - drafted))
    return _close(self, now, timed)


budget_mod.AutoBudget.report, budget_mod.AutoBudget._close = report, close

world, target, inputs, gen = world_calls(8)
draft = world.drafts[name]
auto = hf_specmm.Auto(draft, max_tokens=64)
keys = set()
for _ in range(warm):
    for x in inputs:
        target.generate(**x, **gen, assistant_model=auto)
        keys.add(hf_specmm.last_stats(target).auto["cost_key"])
taken: dict = {}
for log in logs[-4 * 8:]:
    for e in log:
        taken[e["shape"]] = taken.get(e["shape"], 0) + 1
print("Auto's last 8 passes:", sorted(taken.items(), key=lambda kv: -kv[1]))
key = [k for k in keys if k is not None]
print("keys", key)
table = COSTS.tables[key[0]]
ranked = cost_aware_policy(64, 8, True, True).rank(auto.acceptance(target), table, 1, batch=True)
pred = {c.shape.label: c for c in ranked}
print("ranking top 6:", [(c.shape.label, round(c.predicted_tokens_per_s, 1)) for c in ranked[:6]])
print("factors chain/tree:", table.time_factor("chain"), table.time_factor("tree"), "speed index", table.speed)

seconds: dict = {g: [] for g in range(1, 9)}
rounds: dict = {g: [] for g in range(1, 9)}
critical = {}
for p in range(passes):
    for g in range(1, 9):
        fixed = hf_specmm.Auto(draft, shapes=[g])  # a fixed policy records no timing into the cost tables
        del logs[:]
        if p == 0 and g == 1:
            del phases[:]
        start, tokens, most = time.perf_counter(), 0, 0
        for x in inputs:
            target.generate(**x, **gen, assistant_model=fixed)
            per_round = hf_specmm.last_stats(target).tokens_per_round
            rows = len(per_round[0]) if per_round else 0
            tokens += max(sum(r[i] for r in per_round) for i in range(rows))
            most += max(sum(1 for r in per_round if r[i] > 0) for i in range(rows))
        seconds[g].append(time.perf_counter() - start)
        critical[g] = tokens / most
        for log in logs:
            rounds[g] += [e["seconds"] for e in log[:-1] if e["rows"] > 4]

print("table chain verify medians (width: ms, n):",
      {w: (round(st.median(v) * 1e3, 2), len(v)) for w, v in sorted(table.verify["chain"].items())})
print("table chain draft medians:",
      {k: (round(st.median(v) * 1e3, 2), len(v)) for k, v in sorted(table.draft.items()) if k.startswith("chain")})
model = table.model()
print("model verify w2..9:", [round(model.verify_time("chain", w) * 1e3, 2) for w in range(2, 10)])
print("model draft g1..8:", [round(model.chain_draft_time(g) * 1e3, 2) for g in range(1, 9)])
for g in range(1, 9):
    ph = [(a, b) for label, r, a, b in phases if label == f"chain {g}" and r > 4]
    print(f"measured chain {g}: draft {st.median(a for a, _ in ph) * 1e3:.2f} "
          f"verify+rest {st.median(b for _, b in ph) * 1e3:.2f} (n {len(ph)})")
print("chain | curve s | x factor | measured s (median, mean) | pred/meas(mean) | predicted tok/s | "
      "realised critical tok/s (mean) | ratio | s/pass")
factor = table.time_factor("chain")
for g in range(1, 9):
    c = pred.get(f"chain {g}")
    if c is None:
        print(g, "unranked")
        continue
    predicted_s = c.curve_seconds * factor
    med, mean = st.median(rounds[g]), st.mean(rounds[g])
    real = critical[g] / mean
    print(f"{g} | {c.curve_seconds * 1e3:.2f} | {predicted_s * 1e3:.2f} | {med * 1e3:.2f} {mean * 1e3:.2f} | "
          f"{predicted_s / mean:.3f} | {c.predicted_tokens_per_s:.1f} | {real:.1f} | "
          f"{c.predicted_tokens_per_s / real:.3f} | {st.median(seconds[g]):.4f}")
