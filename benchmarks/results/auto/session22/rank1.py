"""World batch 1, one process: 40 warm-up Auto calls, then in turns `cycles` times over the 32 prompts: Auto(shapes=[g])
for g in 1..8 and Auto. Then per chain: measured whole time, rounds, round seconds, vs Auto's batch-1 ranking
(predicted tokens/round and round ms). argv: draft cycles"""
import sys, os, time, collections, statistics
import hf_specmm
from hf_specmm.auto.store import COSTS
from world_batch1 import world_batch1
name = sys.argv[1]; cycles = int(sys.argv[2])
world, target, x1, gen = world_batch1()
d = world.drafts[name]
auto = hf_specmm.Auto(d, max_tokens=64)
for c in range(40): target.generate(**x1[c % 32], **gen, assistant_model=auto)
fixed = {g: hf_specmm.Auto(d, max_tokens=64, shapes=[g]) for g in range(1, 9)}
names = list(range(1, 9)) + ["auto"]
W = []
T = collections.defaultdict(float); R = collections.Counter(); RS = collections.defaultdict(float); TOK = collections.Counter()
for c in range(cycles):
    for i, x in enumerate(x1):
        k0 = (c * 3 + i) % len(names); order = names[k0:] + names[:k0]
        for g in order:
            s = time.perf_counter(); target.generate(**x, **gen, assistant_model=auto if g == "auto" else fixed[g]); T[g] += time.perf_counter() - s
            a = hf_specmm.last_stats(target).auto
            if g == "auto":
                W.append((c, i, "PLAIN" if a["shapes"] == ["plain generate"] else ",".join(f"{s}:{n}" for s, n in collections.Counter(a["shapes"]).most_common(3)), round(1e3 * (time.perf_counter() - s), 1)))
            for lab, v in a["per_shape"].items():
                R[g] += v["rounds"]; RS[g] += v["seconds"]; TOK[g] += v["tokens"]
best = min(range(1, 9), key=T.get)
key = next(k for k in COSTS.tables if "batch<=1 " in k or k.endswith("batch<=1") or "batch<=1 |" in k)
table = COSTS.tables[key]
budget = auto.budget(target, 1, False, key.split(" | ")[-1], True, True, target.device)
ranked = budget.policy.rank(auto.acceptance(target), table, 1, False)
pred = {c.shape.gamma: c for c in ranked if c.shape.tree is None}
print("key", key, "best", best, "auto/best", round(T["auto"] / T[best], 3), "per call ms", {g: round(1e3 * T[g] / (32 * cycles), 2) for g in names})
for g in range(1, 9):
    c = pred.get(g)
    print(f"chain {g}: time/best {T[g]/T[best]:.3f} rounds {R[g]/cycles:6.1f} round_ms {1e3*RS[g]/R[g]:5.2f} out_ms/call {1e3*(T[g]-RS[g])/(32*cycles):5.2f}"
          + (f" | pred tps {c.predicted_tokens_per_s:7.0f} exp {c.expected_tokens:5.2f} curve_ms {1e3*c.curve_seconds:5.2f}" if c else ""))
c = pred.get(0); print("plain pred", c and round(c.predicted_tokens_per_s), "auto rounds", R["auto"] / cycles, "round_ms", 1e3 * RS["auto"] / max(R["auto"], 1), "out_ms/call", 1e3 * (T["auto"] - RS["auto"]) / (32 * cycles))
print("top5", [(c.shape.label, round(c.predicted_tokens_per_s)) for c in ranked[:5]])

for w in W: print(*w)
